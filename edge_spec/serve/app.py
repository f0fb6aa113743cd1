"""The routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics (OpenAI's shapes).

Every error is OpenAI's error JSON (schema.ApiError), never a traceback: an unexpected exception is logged here and
answered 500. Streaming answers are server-sent events in OpenAI's chunk format, ended by `data: [DONE]`; an error
after the stream began is sent as a `data: {"error": ...}` event (what the openai client raises on).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid

from jinja2 import TemplateError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edge_spec.errors import EdgeSpecError
from edge_spec.serve.metrics import Metrics
from edge_spec.serve.schema import (ApiError, Request, chat_messages, check_model, completion_prompt, parse_json,
                                    sampling)
from edge_spec.serve.worker import CLIENT_GONE, SHUTDOWN, TIMEOUT, Cancelled, Job, Outcome, Worker

log = logging.getLogger("edge_spec.serve")
MAX_BODY = 8 * 1024 * 1024  # bytes of a request body (413 beyond)
TICK_S = 0.1  # how often a waiting request looks at its deadline and the queue


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _cancelled_error(reason: str, timeout_s: float) -> ApiError:
    if reason == TIMEOUT:
        return ApiError(504, f"the request ran past this server's time limit of {timeout_s:g} s (--timeout)",
                        type="timeout_error", code="timeout")
    if reason == SHUTDOWN:
        return ApiError(503, "the server is shutting down; the request was not completed", type="server_error",
                        code="shutting_down")
    return ApiError(499, "the client disconnected", code="client_closed_request")


class _Stream(StreamingResponse):
    """A streaming response that runs `on_close` however it ends (sent, client gone, task cancelled)."""

    def __init__(self, content, on_close, **kwargs):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class Server:
    """The state behind the routes: one engine, its worker, the metrics."""

    def __init__(self, engine, *, model_id: str, queue_size: int = 64, timeout_s: float = 300.0,
                 api_key: str | None = None):
        self.engine = engine
        self.model_id = model_id
        self.timeout_s = timeout_s
        self.api_key = api_key
        self.metrics = Metrics(model_id)
        self.worker = Worker(engine, queue_size=queue_size, metrics=self.metrics)
        self.created = int(time.time())
        self.notice_logged = False

    # ---- request handling ----------------------------------------------------------------------------------------
    def _auth(self, request: HttpRequest) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key (send the server's --api-key as 'Authorization: Bearer KEY')",
                           type="authentication_error", code="invalid_api_key")

    async def _body(self, request: HttpRequest) -> dict:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            raise ApiError(413, f"the request body is {int(length)} bytes, over this server's limit of {MAX_BODY}",
                           code="request_too_large")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise ApiError(413, f"the request body is over this server's limit of {MAX_BODY} bytes",
                               code="request_too_large")
        return parse_json(bytes(data))

    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        tokenizer = self.engine.tokenizer
        if chat:
            messages = chat_messages(body)
            if not tokenizer.chat_template:
                raise ApiError(400, "this bundle has no chat template; use /v1/completions with a plain prompt",
                               param="messages", code="no_chat_template")
            try:
                text = tokenizer.apply_chat_template(messages)
            except (EdgeSpecError, TemplateError, TypeError, ValueError, LookupError) as err:
                what = err.what if isinstance(err, EdgeSpecError) else str(err)
                raise ApiError(400, f"the chat template refused these messages: {what}", param="messages",
                               code="invalid_messages") from None
            ids = tokenizer.encode(text, add_bos=False)  # what Engine.generate(chat=True) encodes
        else:
            prompt = completion_prompt(body, self.engine.vocab_size)
            ids = prompt if isinstance(prompt, list) else self.engine.encode(prompt)
        if not ids:
            raise ApiError(400, "the prompt encodes to zero tokens", param="messages" if chat else "prompt",
                           code="invalid_value")
        return ids

    async def completion(self, request: HttpRequest, chat: bool) -> Response:
        began = time.perf_counter()
        endpoint = "chat" if chat else "completions"
        try:
            self._auth(request)
            body = await self._body(request)
            check_model(body, self.model_id)
            req = sampling(body, self._prompt_ids(body, chat), self.engine.max_context, chat=chat)
            if req.stream:
                return self._stream(req, chat, endpoint, began)
            job = Job(req, None, self.timeout_s)
            future = self.worker.submit(job)
        except ApiError as err:
            self.metrics.request(endpoint, err.status)
            return error_response(err)
        outcome, error = await self._wait(job, future, request)
        if outcome is None:
            status = error.status
            self.metrics.request(endpoint, status, time.perf_counter() - began)
            return error_response(error)
        self._count(outcome)
        self.metrics.request(endpoint, 200, time.perf_counter() - began)
        return JSONResponse(self._full(outcome, chat))

    async def _wait(self, job: Job, future, request: HttpRequest | None):
        """Until the decode ends, the client leaves (non-streaming: watched here), or a cancelled job that never
        started can be answered at once. -> (outcome, None) or (None, ApiError)."""
        watcher = asyncio.ensure_future(_disconnected(request)) if request is not None else None
        try:
            while True:
                waiting = {future} | ({watcher} if watcher is not None else set())
                done, _ = await asyncio.wait(waiting, timeout=TICK_S, return_when=asyncio.FIRST_COMPLETED)
                if future in done:
                    return _result(future, self.timeout_s)
                if watcher is not None and watcher in done:
                    job.cancel(CLIENT_GONE)
                    return None, _cancelled_error(CLIENT_GONE, self.timeout_s)
                if time.monotonic() > job.deadline:
                    job.cancel(TIMEOUT)
                if job.cancel_reason is not None and not job.started.is_set():
                    return None, _cancelled_error(job.cancel_reason, self.timeout_s)
        except asyncio.CancelledError:
            job.cancel(CLIENT_GONE)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()

    def _stream(self, req: Request, chat: bool, endpoint: str, began: float) -> Response:
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[str] = asyncio.Queue()
        job = Job(req, lambda text: loop.call_soon_threadsafe(deltas.put_nowait, text), self.timeout_s)
        future = self.worker.submit(job)  # a full queue raises here, before any byte is sent (429)
        rid, created = _id(chat), int(time.time())
        usage_field = {"usage": None} if req.include_usage else {}

        def chunk(choice: dict, **extra) -> str:
            obj = "chat.completion.chunk" if chat else "text_completion"
            data = {"id": rid, "object": obj, "created": created, "model": self.model_id, "system_fingerprint": None,
                    "choices": [choice] if choice is not None else [], **usage_field, **extra}
            return f"data: {json.dumps(data)}\n\n"

        def piece(text: str | None, finish: str | None = None) -> dict:
            if chat:
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        async def events():
            status = 200
            try:
                if chat:
                    yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None})
                getter = None
                try:
                    while True:
                        getter = getter or asyncio.ensure_future(deltas.get())
                        done, _ = await asyncio.wait({getter, future}, timeout=TICK_S,
                                                     return_when=asyncio.FIRST_COMPLETED)
                        if getter in done:
                            yield chunk(piece(getter.result()))
                            getter = None
                            continue
                        if future in done:
                            break
                        if time.monotonic() > job.deadline:
                            job.cancel(TIMEOUT)
                        if job.cancel_reason is not None and not job.started.is_set():
                            break
                finally:
                    if getter is not None:
                        getter.cancel()
                while not deltas.empty():  # what the thread queued before it finished
                    yield chunk(piece(deltas.get_nowait()))
                if future.done():
                    outcome, error = _result(future, self.timeout_s)
                else:
                    outcome, error = None, _cancelled_error(job.cancel_reason, self.timeout_s)
                if outcome is None:
                    status = error.status
                    yield f"data: {json.dumps(error.body())}\n\n"
                else:
                    self._count(outcome)
                    yield chunk(piece(None, outcome.finish_reason), edge_spec=outcome.stats)
                    if req.include_usage:
                        usage_field["usage"] = _usage(outcome)
                        yield chunk(None, edge_spec=outcome.stats)
                yield "data: [DONE]\n\n"
            except (asyncio.CancelledError, GeneratorExit):
                status = 499
                job.cancel(CLIENT_GONE)
                raise
            finally:
                self.metrics.request(endpoint, status, time.perf_counter() - began)

        return _Stream(events(), on_close=lambda: job.cancel(CLIENT_GONE), media_type="text/event-stream",
                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _count(self, outcome: Outcome) -> None:
        self.metrics.tokens(outcome.prompt_tokens, outcome.completion_tokens, outcome.stats)
        if outcome.notice and not self.notice_logged:
            self.notice_logged = True
            log.warning(f"notice: decoding plainly: {outcome.notice}")

    def _full(self, outcome: Outcome, chat: bool) -> dict:
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": outcome.text, "refusal": None},
                      "logprobs": None, "finish_reason": outcome.finish_reason}
        else:
            choice = {"index": 0, "text": outcome.text, "logprobs": None, "finish_reason": outcome.finish_reason}
        return {"id": _id(chat), "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_id, "system_fingerprint": None, "choices": [choice], "usage": _usage(outcome),
                "edge_spec": outcome.stats}

    # ---- the other routes ----------------------------------------------------------------------------------------
    async def models(self, request: HttpRequest) -> Response:
        try:
            self._auth(request)
        except ApiError as err:
            return error_response(err)
        card = {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "edge-spec"}
        name = request.path_params.get("model")
        if name is None:
            return JSONResponse({"object": "list", "data": [card]})
        if name != self.model_id:
            return error_response(ApiError(404, f"the model '{name}' does not exist here; this server serves "
                                                f"'{self.model_id}'", param="model", code="model_not_found"))
        return JSONResponse(card)

    async def health(self, request: HttpRequest) -> Response:
        try:
            self._auth(request)
        except ApiError as err:
            return error_response(err)
        worker = self.worker
        return JSONResponse({"status": "shutting_down" if worker.draining else "ok", "model": self.model_id,
                             "busy": worker.busy, "queued": worker.queued, "queue_limit": worker.queue_size,
                             "speculative": _speculative(self.engine)},
                            status_code=503 if worker.draining else 200)

    async def metrics_text(self, request: HttpRequest) -> Response:
        try:
            self._auth(request)
        except ApiError as err:
            return error_response(err)
        self.metrics.set_queue(self.worker.queued, self.worker.busy)
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    def app(self) -> Starlette:
        async def chat(request):
            return await self.completion(request, True)

        async def completions(request):
            return await self.completion(request, False)

        async def http_error(request, exc: HTTPException):
            code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
            message = (f"no route {request.method} {request.url.path} (POST /v1/chat/completions, POST /v1/completions, "
                       "GET /v1/models, GET /health, GET /metrics)") if exc.status_code in (404, 405) else exc.detail
            return error_response(ApiError(exc.status_code, message, code=code))

        async def server_error(request, exc: Exception):
            log.exception("internal error", exc_info=exc)
            return error_response(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error",
                                           code="internal_error"))

        routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
                  Route("/v1/completions", completions, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/v1/models/{model:path}", self.models, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.metrics_text, methods=["GET"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


def _speculative(engine) -> bool:
    from edge_spec.serve.worker import _speculative as speculative

    return speculative(engine)


async def _disconnected(request: HttpRequest) -> None:
    """Returns when the client has gone (its body was read: the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _result(future, timeout_s: float):
    err = future.exception()
    if err is None:
        return future.result(), None
    if isinstance(err, Cancelled):
        return None, _cancelled_error(err.reason, timeout_s)
    if isinstance(err, ApiError):
        return None, err
    log.error("decode failed", exc_info=err)
    return None, ApiError(500, f"the decode failed: {type(err).__name__}", type="server_error", code="decode_failed")


def _usage(outcome: Outcome) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}


def _id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
