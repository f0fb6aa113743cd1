"""`edge-spec serve --runtime native`: the same live server (tests/test_serve.py's `Live`) driving the C++ runner
through its C API (edge_spec.serve.native over edge_spec.runtimes.native_capi), on the tiny llama ONNX bundle with
its drafter. The Python runtime's Engine on the same bundle is the oracle: greedy answers are its text token for
token; a cancel raised in the Python stream callback stops the runner (it crosses C as a nonzero return).

The runner's library cannot share a process with ExecuTorch's Python LLM ops (both register llama::update_cache_*),
which other tests of this pytest worker load: each case that loads it runs in a fresh interpreter (tests/isolated.py),
with the bundle and the library passed in as paths.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.isolated import isolated  # noqa: E402
from tests.test_native import native  # noqa: E402,F401 (the build fixture)
from tests.test_native_ort import ort_native  # noqa: E402,F401 (build/native with the onnx backend)
from tests.test_serve import MODEL, PROMPT, Live, Slow, bundle, metric, wait_until  # noqa: E402,F401

LIB = "libedge_spec.so"


def _engines(bundle: str, lib: str):
    from edge_spec.api import load_bundle
    from edge_spec.serve.native import NativeEngine

    return load_bundle(bundle, threads=1, spin=False), NativeEngine(bundle, threads=1, library=lib)


# ---- the cases, each run in a fresh interpreter -------------------------------------------------------------------
def _answers(bundle: str, lib: str) -> None:
    engine, native_engine = _engines(bundle, lib)
    assert native_engine.vocab_size == engine.vocab_size and native_engine.max_context == engine.max_context
    assert native_engine.drafter is not None and native_engine.exactness is not None
    assert native_engine.exactness.exact  # the tiny bundle is batch-invariant on every CPU we run on
    assert "onnxruntime" in native_engine.identity
    server = Live(native_engine, queue=64, timeout=60)
    try:
        client = server.client()
        # greedy completion, streaming and not: the Python runtime's text and counts
        want = engine.generate(PROMPT, max_new_tokens=12, temperature=0.0)
        done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
        stats = done.model_extra["edge_spec"]
        assert done.choices[0].text == want.text
        assert done.usage.prompt_tokens == want.prompt_tokens and done.usage.completion_tokens == want.new_tokens
        assert stats["speculative"] is True and stats["tau"] >= 1.0 and stats["target_passes"] >= 1
        chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == want.new_tokens
        # chat through the same template
        want = engine.generate(PROMPT, max_new_tokens=8, temperature=0.0, chat=True)
        done = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0,
                                              messages=[{"role": "user", "content": PROMPT}])
        assert done.choices[0].message.content == want.text
        # 8 clients x 2 requests at once: each its own prompt's answer
        prompts = [f"w{10 + i} w{40 + i} w{90 + i}" for i in range(8)]
        expected = {p: engine.generate(p, max_new_tokens=4, temperature=0.0).text for p in prompts}
        got, errors = [], []

        def client_loop(prompt):
            try:
                for _ in range(2):
                    answer = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=4,
                                                                temperature=0)
                    got.append((prompt, answer.choices[0].text))
            except Exception as err:  # noqa: BLE001 (reported below)
                errors.append(repr(err))

        threads = [threading.Thread(target=client_loop, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(got) == 16 and all(text == expected[p] for p, text in got)
        # seeded sampling is reproducible, and the seed matters
        def sample(seed):
            return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, top_p=0.9,
                                             seed=seed).choices[0].text

        first = sample(7)
        assert sample(7) == first and len({sample(seed) for seed in range(6)}) > 1
        # a stop string is cut as OpenAI does
        full = engine.generate("w15 w45 w95", max_new_tokens=8, temperature=0.0).text
        cut = full[:full.index("5 w3")]
        done = client.completions.create(model=MODEL, prompt="w15 w45 w95", max_tokens=8, temperature=0,
                                         stop=["5 w3"])
        assert done.choices[0].text == cut and done.choices[0].finish_reason == "stop"
    finally:
        server.stop()
        native_engine.close()


def _cancel(bundle: str, lib: str) -> None:
    _, native_engine = _engines(bundle, lib)
    server = Live(Slow(native_engine, 0.05), timeout=0.5)
    try:
        began = time.monotonic()
        with pytest.raises(openai.InternalServerError) as info:
            server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=100, temperature=0)
        assert info.value.status_code == 504 and time.monotonic() - began < 3
        assert metric(server.url, "edge_spec_cancelled_total", reason="time limit") == 1
        wait_until(lambda: not httpx.get(f"{server.url}/health").json()["busy"])
    finally:
        server.stop()
    server = Live(native_engine, timeout=30)
    try:
        done = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
        assert done.usage.completion_tokens >= 1 and done.choices[0].finish_reason in ("stop", "length")
    finally:
        server.stop()
        native_engine.close()


# ---- the tests --------------------------------------------------------------------------------------------------
def test_native_server_answers_as_the_python_runtime(ort_native, bundle):  # noqa: F811
    """Greedy completions (streaming and not) and chat == the Python runtime's text and counts; the runner's host
    check is the verdict; 8 concurrent clients each get their own answer; seeded sampling repeats; stop strings."""
    isolated(_answers, str(bundle), str(ort_native / LIB))


def test_a_cancel_stops_the_runner_and_it_keeps_serving(ort_native, bundle):  # noqa: F811
    """The time limit (504) is raised inside the Python callback: the runner stops at its next token and the
    next request is answered in full (the handle is not left mid-run)."""
    isolated(_cancel, str(bundle), str(ort_native / LIB))


def test_the_library_refuses_a_process_with_executorchs_llm_ops(ort_native, monkeypatch):  # noqa: F811
    """Loading it beside ExecuTorch's Python LLM ops would abort the process: refused with the fix instead."""
    import sys

    from edge_spec.errors import ConfigError
    from edge_spec.runtimes import native_capi

    monkeypatch.setitem(sys.modules, native_capi.ET_CUSTOM_OPS, sys)  # as if they were imported
    with pytest.raises(ConfigError, match="separate processes"):
        native_capi.Library(ort_native / LIB)


def test_the_cli_refuses_native_flag_mixups_and_a_missing_library(bundle, capsys, tmp_path):  # noqa: F811
    from edge_spec.cli import main

    cases = [(["--runtime", "native", "--no-spin"], "--no-spin"),
             (["--native-lib", str(tmp_path / LIB)], "--native-lib"),
             (["--runtime", "native", "--native-lib", str(tmp_path / LIB)], "make native")]
    for args, words in cases:
        code = main(["serve", "--bundle", str(bundle), "--port", "0", *args])
        err = capsys.readouterr().err
        assert code == 2 and "error:" in err and "fix:" in err and words in err and "Traceback" not in err, err


def test_bench_serve_measures_both_runtimes_and_their_texts_agree(ort_native, bundle, tmp_path):  # noqa: F811
    """`edge-spec bench-serve` (a benchmark, not a timed test: only its rows and their agreement are checked)."""
    import json

    from edge_spec.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "chat": False}) + "\n" for p in (PROMPT, "w15 w45 w95")))
    out = tmp_path / "bench.json"
    code = main(["bench-serve", "--bundle", str(bundle), "--runtime", "python", "native", "--prompts", str(prompts),
                 "--max-new-tokens", "6", "--clients", "1", "3", "--threads", "1", "--native-lib",
                 str(ort_native / LIB), "--json", str(out), "--markdown", str(tmp_path / "b.md")])
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["runtime"], r["mode"], r["clients"]) for r in rows] == [
        (rt, mode, c) for rt in ("python", "native") for mode, c in (("direct", 1), ("server", 1), ("server", 3))]
    assert all(r["same_text"] == "2/2" for r in rows if "same_text" in r)
    assert [r["requests"] for r in rows] == [2, 2, 6] * 2 and all(r["tok_s"] > 0 for r in rows)
    assert "| native | server | 3 |" in (tmp_path / "b.md").read_text()


# ---- the real SmolLM2 (the `real` tier: these fixtures depend on `smollm2` / `converted`) -------------------------
@pytest.fixture(scope="module")
def smollm2_serve_bundle(smollm2, converted):
    """SmolLM2-135M-Instruct + its built-in drafter as `make demo` exports it (ONNX int4)."""
    from edge_spec.api import load_export_drafter, resolve_drafter
    from edge_spec.exporters.onnx import export_bundle

    drafter = load_export_drafter(resolve_drafter("builtin", "smollm2-135m", fmt="onnx"), smollm2)
    return export_bundle(smollm2, converted.parent / "bundle-serve-int4", drafter=drafter, precision="int4",
                         max_context=512)


def _smollm2_served(bundle: str, lib: str | None) -> None:
    from edge_spec.api import load_bundle
    from edge_spec.serve.native import NativeEngine

    engine = load_bundle(bundle, threads=2)
    served = engine if lib is None else NativeEngine(bundle, threads=2, library=lib)
    question = "What is the capital of France?"
    want = engine.generate(question, chat=True, max_new_tokens=32)
    assert "Paris" in want.text
    server = Live(served, timeout=300)
    try:
        client = server.client()
        messages = [{"role": "user", "content": question}]
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0)
        assert done.choices[0].message.content == want.text
        assert done.model_extra["edge_spec"]["speculative"] is True and done.model_extra["edge_spec"]["tau"] > 1.0
        chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0,
                                                stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
        prompt = "The three primary colours are"
        text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
        assert text == engine.generate(prompt, max_new_tokens=24).text
    finally:
        server.stop()
        if served is not engine:
            served.close()


@pytest.mark.parametrize("runtime", ["python", "native"])
def test_smollm2_served_answers_equal_generate(runtime, smollm2_serve_bundle, native):  # noqa: F811
    """The official client against a live server on the real model: chat (streaming and not) and a completion, greedy,
    == `edge-spec generate`'s text; the decode was speculative (tau > 1) on either runtime."""
    lib = str(native / LIB) if runtime == "native" else None
    isolated(_smollm2_served, str(smollm2_serve_bundle), lib)
