"""`edge-spec serve` (edge_spec/serve/): a live server on 127.0.0.1 against the tiny llama ONNX bundle (with its
drafter: speculative by default), driven by the official `openai` client and raw httpx for what the client hides.

The server runs in a thread of this process (uvicorn on a socket bound to a free port); the slow cases (a
disconnect, a full queue, a time limit, shutdown) wrap the same engine so that each token takes a while.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from edge_spec.api import load_bundle  # noqa: E402
from edge_spec.serve.command import bind, make_server  # noqa: E402

MODEL = "tiny-llama"
PROMPT = "w10 w11 w12 w13 w14"


@pytest.fixture(scope="module")
def bundle(tiny_bundles):
    return tiny_bundles.get("onnx", "llama")[0]


@pytest.fixture(scope="module")
def engine(bundle):
    return load_bundle(bundle, threads=1, spin=False)


class Live:
    """A server running in a thread; `stop()` ends it the way uvicorn's signal handler does."""

    def __init__(self, engine, **options):
        sock = bind("127.0.0.1", 0)
        self.server, self.state = make_server(engine, sock, model_id=MODEL, log_level="warning", **options)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def client(self, **kwargs):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", "unused"),
                             max_retries=kwargs.pop("max_retries", 0), **kwargs)

    def stop(self, signal_like: bool = False):
        if signal_like:
            import signal

            self.server.handle_exit(signal.SIGTERM, None)
        else:
            self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


@pytest.fixture(scope="module")
def live(engine):
    server = Live(engine, queue=64, timeout=60)
    yield server
    server.stop()


class Slow:
    """The engine, each streamed piece of text delayed by `delay` seconds (a decode that takes a while)."""

    def __init__(self, engine, delay: float):
        self._engine, self.delay = engine, delay

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, prompt, *, stream=None, **kwargs):
        def slow(text):
            time.sleep(self.delay)
            stream(text)

        return self._engine.generate(prompt, stream=slow, **kwargs)


def metric(url: str, name: str, **labels) -> float:
    text = httpx.get(f"{url}/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


# ---- answers ----------------------------------------------------------------------------------------------------
def test_models_and_health(live):
    models = live.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert live.client().models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        live.client().models.retrieve("gpt-4o")
    health = httpx.get(f"{live.url}/health").json()
    assert health["status"] == "ok" and health["speculative"] is True and health["busy"] is False


@pytest.mark.parametrize("stream", [False, True])
def test_completion_greedy_equals_generate(live, engine, stream):
    want = engine.generate(PROMPT, max_new_tokens=12, temperature=0.0)
    client = live.client()
    if stream:
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        usage = chunks[-1].usage
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        stats = chunks[-1].model_extra["edge_spec"]
    else:
        done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
        text, usage, finish = done.choices[0].text, done.usage, done.choices[0].finish_reason
        stats = done.model_extra["edge_spec"]
    assert text == want.text
    assert usage.prompt_tokens == want.prompt_tokens and usage.completion_tokens == want.new_tokens
    assert finish == ("stop" if want.stop_reason == "eos" else "length")
    assert stats["speculative"] is True and stats["tau"] >= 1.0 and stats["tokens_per_s"] >= 0


@pytest.mark.parametrize("stream", [False, True])
def test_chat_greedy_equals_generate_chat(live, engine, stream):
    want = engine.generate(PROMPT, max_new_tokens=10, temperature=0.0, chat=True)
    client = live.client()
    messages = [{"role": "user", "content": PROMPT}]
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10,
                                                     temperature=0, stream=True))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    else:
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
        text = done.choices[0].message.content
        assert done.usage.prompt_tokens == want.prompt_tokens
    assert text == want.text


def test_chat_renders_every_message_through_the_template(live, engine):
    messages = [{"role": "system", "content": "w20 w21"}, {"role": "user", "content": "w30"},
                {"role": "assistant", "content": "w40"}, {"role": "user", "content": "w50 w51"}]
    ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages), add_bos=False)
    want = engine.generate(ids, max_new_tokens=8, temperature=0.0)
    done = live.client().chat.completions.create(messages=messages, model=MODEL, max_tokens=8, temperature=0)
    assert done.choices[0].message.content == want.text
    assert done.usage.prompt_tokens == len(ids)


def test_seeded_sampling_is_reproducible(live):
    client = live.client()

    def run(seed, stream=False):
        args = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=1.0, top_p=0.9, seed=seed)
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(stream=True, **args))
        return client.completions.create(**args).choices[0].text

    first = run(7)  # speculative sampling with a seed drafts a fixed k (the adaptive k follows timings)
    assert all(run(7) == first for _ in range(4)) and run(7, stream=True) == first
    assert len({run(seed) for seed in range(8)}) > 1  # the seed matters


def test_stop_strings_are_cut_as_openai_does(live, engine):
    """The text ends right before the stop string's first occurrence (here it spans two tokens: held back while it
    could still be one), the decode stops there, finish_reason "stop"."""
    prompt = "w15 w45 w95"
    full = engine.generate(prompt, max_new_tokens=8, temperature=0.0).text
    assert full.startswith("w95 w95 w95 w35"), full  # the tiny model's greedy continuation
    cut = full[:full.index("5 w3")]  # "w95 w95 w9"
    client = live.client()
    done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stop=["5 w3", "zzz"])
    assert done.choices[0].text == cut and done.choices[0].finish_reason == "stop"
    assert done.usage.completion_tokens == 4  # the decode ended with the token that completed the stop string
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, stop="5 w3",
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_clients_are_answered_and_not_mixed_up(live, engine):
    """16 clients x 4 requests at once, each with its own prompt: every answer is the one for its prompt."""
    prompts = [f"w{10 + i} w{40 + i} w{90 + i}" for i in range(16)]
    want = {p: engine.generate(p, max_new_tokens=4, temperature=0.0).text for p in prompts}
    got, errors = {}, []

    def client_thread(i):
        client = live.client()
        try:
            for j in range(4):
                prompt = prompts[i]
                if j % 2:
                    text = "".join(c.choices[0].text for c in client.completions.create(
                        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, stream=True))
                else:
                    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0).choices[0].text
                got[(i, j)] = (prompt, text)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(repr(err))

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(got) == 64
    assert all(text == want[prompt] for prompt, text in got.values())


# ---- bad requests -------------------------------------------------------------------------------------------------
BAD = [
    ("/v1/completions", b"{not json", 400, "invalid_json", None),
    ("/v1/completions", b"[1, 2]", 400, "invalid_json", None),
    ("/v1/completions", {"model": "gpt-4o", "prompt": "w5"}, 404, "model_not_found", "model"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": "ten"}, 422, "invalid_type", "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "max_tokens": 0}, 400, "invalid_value", "max_tokens"),
    ("/v1/completions", {"prompt": "w5", "temperature": 3}, 400, "invalid_value", "temperature"),
    ("/v1/completions", {"prompt": "w5", "top_p": 0}, 400, "invalid_value", "top_p"),
    ("/v1/completions", {"prompt": "w5", "seed": -1}, 400, "invalid_value", "seed"),
    ("/v1/completions", {"prompt": "w5", "n": 2}, 400, "unsupported_value", "n"),
    ("/v1/completions", {"prompt": "w5", "stop": ["a", "b", "c", "d", "e"]}, 400, "invalid_value", "stop"),
    ("/v1/completions", {"prompt": "w5", "logprobs": 3}, 400, "unsupported_parameter", "logprobs"),
    ("/v1/completions", {"max_tokens": 3}, 422, "missing_parameter", "prompt"),
    ("/v1/completions", {"prompt": [5, 99999]}, 400, "invalid_value", "prompt"),
    ("/v1/completions", {"prompt": "w5 " * 150, "max_tokens": 20}, 400, "context_length_exceeded", "max_tokens"),
    ("/v1/completions", {"prompt": "w5 " * 170}, 400, "context_length_exceeded", "prompt"),
    ("/v1/chat/completions", {"messages": "hi"}, 422, "invalid_type", "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "unsupported_value",
     "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "stream": "yes"}, 422, "invalid_type",
     "stream"),
]


def test_bad_requests_are_refused_cleanly_and_the_server_keeps_serving(live):
    for path, body, status, code, param in BAD:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = httpx.post(live.url + path, content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert (error["code"], error["param"]) == (code, param), (body, error)
        assert "Traceback" not in r.text
    r = httpx.post(live.url + "/v1/completions", json={"prompt": "w5 " * 150, "max_tokens": 20})
    assert "maximum context length is 160 tokens" in r.json()["error"]["message"]
    r = httpx.post(live.url + "/v1/completions", content=b"x" * (9 * 1024 * 1024))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(live.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    with pytest.raises(openai.NotFoundError):  # what the official client makes of an unknown model
        live.client().completions.create(model="gpt-4o", prompt="w5", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        live.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w5"}], n=3)
    done = live.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    assert done.choices[0].text and done.usage.completion_tokens <= 3


def test_api_key_is_checked_on_every_request(engine):
    server = Live(engine, api_key="sekrit")
    try:
        for method, path in [("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"),
                             ("POST", "/v1/completions")]:
            r = httpx.request(method, server.url + path, json={"prompt": "w5"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
            r = httpx.request(method, server.url + path, json={"prompt": "w5"}, headers={"Authorization": "Bearer no"})
            assert r.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").models.list()
        done = server.client(api_key="sekrit").completions.create(model=MODEL, prompt="w5", max_tokens=2)
        assert done.choices[0].text
    finally:
        server.stop()


# ---- the queue, cancellation, time limits, shutdown ---------------------------------------------------------------
class Streaming:
    """A streaming request opened with raw httpx. Keep it referenced: a dropped line iterator closes the response
    when it is collected (a disconnect)."""

    def __init__(self, url: str, max_tokens: int = 100):
        self.client = httpx.Client(timeout=30)
        request = self.client.build_request("POST", f"{url}/v1/completions", json={
            "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True, "model": MODEL})
        self.response = self.client.send(request, stream=True)
        self.lines = self.response.iter_lines()

    def close(self):
        self.response.close()
        self.client.close()


def test_a_disconnect_mid_stream_frees_the_slot(engine):
    server = Live(Slow(engine, 0.05), queue=0)
    try:
        stream = Streaming(server.url)
        assert next(stream.lines).startswith("data: ")  # decoding: one token arrived
        assert httpx.get(f"{server.url}/health").json()["busy"] is True
        stream.close()
        began = time.monotonic()
        wait_until(lambda: not httpx.get(f"{server.url}/health").json()["busy"], timeout=5)
        assert time.monotonic() - began < 4  # the 100-token decode (5 s) was cut short
        assert metric(server.url, "edge_spec_cancelled_total", reason="client disconnected") == 1
        done = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
        assert done.choices[0].finish_reason in ("length", "stop")  # the slot is free again (queue 0)
    finally:
        server.stop()


def test_a_full_queue_answers_429_with_retry_after(engine):
    server = Live(Slow(engine, 0.05), queue=1)
    try:
        first = Streaming(server.url)
        assert next(first.lines).startswith("data: ")  # decoding
        second = Streaming(server.url)  # waits (the queue holds one)
        wait_until(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 1)
        r = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
        first.close()
        second.close()
        wait_until(lambda: httpx.get(f"{server.url}/health").json() | {"model": 0} ==
                   {"status": "ok", "model": 0, "busy": False, "queued": 0, "queue_limit": 1, "speculative": True})
        assert server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).choices
    finally:
        server.stop()


def test_the_time_limit_ends_a_decode(engine):
    server = Live(Slow(engine, 0.05), timeout=0.5)
    try:
        began = time.monotonic()
        with pytest.raises(openai.InternalServerError) as info:  # 504
            server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=100, temperature=0)
        assert info.value.status_code == 504 and "time limit" in str(info.value)
        assert time.monotonic() - began < 3
        with pytest.raises(openai.APIError, match="time limit"):  # streaming: an error event ends the stream
            for _ in server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=100, temperature=0,
                                                        stream=True):
                pass
        assert metric(server.url, "edge_spec_cancelled_total", reason="time limit") == 2
    finally:
        server.stop()


def test_sigterm_finishes_the_running_request_and_answers_the_queued_one(engine):
    """uvicorn's SIGTERM handler (called as the signal calls it): the running decode completes, the queued request
    gets a 503 at once, new connections are refused, and the server exits."""
    server = Live(Slow(engine, 0.02), queue=4)
    results = {}

    def call(name):
        try:
            done = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0)
            results[name] = done.choices[0].finish_reason
        except openai.APIStatusError as err:
            results[name] = err.status_code

    running = threading.Thread(target=call, args=("running",))
    running.start()
    wait_until(lambda: httpx.get(f"{server.url}/health").json()["busy"])
    queued = threading.Thread(target=call, args=("queued",))
    queued.start()
    wait_until(lambda: httpx.get(f"{server.url}/health").json()["queued"] == 1)
    server.stop(signal_like=True)
    running.join(30)
    queued.join(30)
    assert results["queued"] == 503
    assert results["running"] in ("length", "stop")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/health")


def test_metrics_are_prometheus_text(live):
    live.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    text = httpx.get(f"{live.url}/metrics").text
    for name in ("edge_spec_requests_total", "edge_spec_completion_tokens_total", "edge_spec_tau",
                 "edge_spec_queue_depth", "edge_spec_request_duration_seconds_bucket"):
        assert f"# TYPE {name.removesuffix('_bucket')} " in text and name in text, name
    assert metric(live.url, "edge_spec_requests_total", endpoint="completions", code="200") >= 1
    assert metric(live.url, "edge_spec_tau") >= 1.0
    assert 'le="+Inf"' in text


def test_the_cli_refuses_bad_flags_without_a_traceback(bundle, capsys):
    from edge_spec.cli import main

    for args, words in [(["--queue", "-1"], "--queue"), (["--timeout", "0"], "--timeout"),
                        (["--port", "70000"], "--port")]:
        code = main(["serve", "--bundle", str(bundle), *args])
        err = capsys.readouterr().err
        assert code == 2 and "error:" in err and "fix:" in err and words in err and "Traceback" not in err, err
    sock = bind("127.0.0.1", 0)  # a port in use
    try:
        code = main(["serve", "--bundle", str(bundle), "--port", str(sock.getsockname()[1])])
        err = capsys.readouterr().err
        assert code == 2 and "cannot listen" in err and "fix:" in err, err
    finally:
        sock.close()


def test_the_command_serves_and_stops_on_sigterm(bundle):
    """`edge-spec serve` as a process: it prints where it listens, answers, and exits on SIGTERM without a
    traceback (uvicorn re-raises the signal once it has shut down, so the exit status is 0 or -SIGTERM)."""
    import re
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "edge_spec.cli", "serve", "--bundle", str(bundle), "--port", "0",
                             "--threads", "1", "--no-spin", "--model-id", MODEL], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        while not (match := re.search(r"on (http://127\.0\.0\.1:\d+)/v1", seen[-1] if seen else "")):
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "".join(seen)
            seen.append(line)
        assert "speculative decoding" in seen[-1], seen[-1]
        client = openai.OpenAI(base_url=match.group(1) + "/v1", api_key="unused", max_retries=0)
        done = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=4, temperature=0)
        assert done.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err, err
