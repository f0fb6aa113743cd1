"""Request bodies of /v1/chat/completions and /v1/completions -> a validated `Request`, or an `ApiError`.

Errors follow OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for bad values, unsupported
options and a prompt over the context, 422 for a parameter of the wrong JSON type or a missing one, 404 for a model
this server does not serve. Parameters OpenAI defines that would change the output and that edge-spec does not
implement (n > 1, penalties, logprobs, tools, ...) are refused by name rather than ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MAX_STOP = 4  # OpenAI's limit on `stop` sequences


class ApiError(Exception):
    """An error answered as OpenAI's error JSON with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Request:
    """What the worker decodes: the prompt as token ids (chat already rendered through the template)."""
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    extra: dict = field(default_factory=dict)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def _wrong_type(param: str, want: str, value) -> ApiError:
    return ApiError(422, f"'{param}' must be {want}, got {json.dumps(value)[:80]}", param=param, code="invalid_type")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise _wrong_type(name, "a number", value)
    if not (lo < value if lo_open else lo <= value) or value > hi:
        bound = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ApiError(400, f"'{name}' must be in {bound}, got {value}", param=name, code="invalid_value")
    return float(value)


def _int(body: dict, name: str, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise _wrong_type(name, "an integer", value)
    if value < lo:
        raise ApiError(400, f"'{name}' must be >= {lo}, got {value}", param=name, code="invalid_value")
    return value


# OpenAI parameters edge-spec does not implement, and the value each may have (the default: accepted and ignored)
UNSUPPORTED = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (False, None),
               "top_logprobs": (0,), "logit_bias": ({},), "tools": ([],), "functions": ([],), "best_of": (1,),
               "echo": (False,), "suffix": ("",), "audio": (), "prediction": (), "modalities": (["text"],)}


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ApiError(400, f"'n' must be 1 (this server returns one choice per request), got {json.dumps(n)}",
                       param="n", code="unsupported_value")
    for name, allowed in UNSUPPORTED.items():
        if name in body and body[name] is not None and body[name] not in allowed:
            raise ApiError(400, f"'{name}' is not supported by edge-spec serve (leave it out)", param=name,
                           code="unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise ApiError(400, "'response_format' other than {\"type\": \"text\"} is not supported", param="response_format",
                       code="unsupported_parameter")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _wrong_type("stop", "a string or a list of strings", stop)
    if len(stops) > MAX_STOP:
        raise ApiError(400, f"'stop' takes at most {MAX_STOP} sequences, got {len(stops)}", param="stop",
                       code="invalid_value")
    if any(s == "" for s in stops):
        raise ApiError(400, "'stop' sequences must not be empty", param="stop", code="invalid_value")
    return stops


def check_model(body: dict, model_id: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise _wrong_type("model", "a string", model)
    if model != model_id:
        raise ApiError(404, f"the model '{model}' does not exist here; this server serves '{model_id}' "
                            "(GET /v1/models)", type="invalid_request_error", param="model", code="model_not_found")


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported",
                               param=f"messages[{index}].content", code="unsupported_value")
            texts.append(part["text"])
        return "".join(texts)
    raise _wrong_type(f"messages[{index}].content", "a string or a list of text parts", content)


ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if messages is None:
        raise ApiError(422, "'messages' is required", param="messages", code="missing_parameter")
    if not isinstance(messages, list):
        raise _wrong_type("messages", "a list of messages", messages)
    if not messages:
        raise ApiError(400, "'messages' must not be empty", param="messages", code="invalid_value")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _wrong_type(f"messages[{i}]", "an object", message)
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role {json.dumps(role)} is not supported "
                                f"({', '.join(ROLES)})", param=f"messages[{i}].role", code="unsupported_value")
        out.append({"role": ROLES[role], "content": _content(message, i)})
    return out


def completion_prompt(body: dict, vocab_size: int) -> str | list[int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError(422, "'prompt' is required", param="prompt", code="missing_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "'prompt' must not be empty", param="prompt", code="invalid_value")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(400, f"'prompt' token {bad[0]} is not a token id of this model (0 to {vocab_size - 1})",
                           param="prompt", code="invalid_value")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(400, "'prompt' holds several prompts; this server takes one per request", param="prompt",
                       code="unsupported_value")
    raise _wrong_type("prompt", "a string or a list of token ids", prompt)


def sampling(body: dict, prompt_ids: list[int], max_context: int, *, chat: bool) -> Request:
    """The shared parameters, checked; the prompt must leave room for at least one new token."""
    _refuse_unsupported(body)
    for flag in ("stream",):
        if body.get(flag) is not None and not isinstance(body[flag], bool):
            raise _wrong_type(flag, "true or false", body[flag])
    stream = bool(body.get("stream"))
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise _wrong_type("stream_options", "an object", options)
        if not stream:
            raise ApiError(400, "'stream_options' is only allowed with \"stream\": true", param="stream_options",
                           code="invalid_value")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _wrong_type("stream_options.include_usage", "true or false", usage)
        include_usage = bool(usage)
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, 1)
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", 0) or 0  # an extension (llama.cpp's): keep the k most likely tokens, 0 = off
    seed = _int(body, "seed", 0)
    stop = _stop(body)
    room = max_context - len(prompt_ids)
    what = "messages" if chat else "prompt"
    if max_tokens is None:
        if room < 1:
            raise ApiError(400, f"this model's maximum context length is {max_context} tokens, and the {what} "
                                f"alone takes {len(prompt_ids)}; shorten it", param=what,
                           code="context_length_exceeded")
        max_tokens = room
    elif len(prompt_ids) + max_tokens > max_context:
        raise ApiError(400, f"this model's maximum context length is {max_context} tokens; you requested "
                            f"{len(prompt_ids) + max_tokens} ({len(prompt_ids)} in the {what}, {max_tokens} for the "
                            f"completion): shorten the {what} or lower '{name}'", param=name,
                       code="context_length_exceeded")
    return Request(prompt_ids, max_tokens, temperature, top_p, top_k, seed, stop, stream, include_usage)
