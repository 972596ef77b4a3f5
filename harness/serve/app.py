"""The OpenAI-compatible routes (FastAPI) over a ServeCore.

Errors answer in OpenAI's shape (protocol.error_body): 400 for a body that fails validation
(naming the field), 404 for an unknown model, 503 when serve.max_queue requests are held or the
core process is gone. A client that disconnects has its request aborted: a watcher of the
connection cancels the stream's writer (or a plain request's wait), which closes its generator.

The ASGI app is the FastAPI app inside a thin stamp (Stamped): it notes when each HTTP request
reached the app (the start of the HTTP side's part of a request's latency, requests.csv's
http_arrival) and the server's own `send`, through which a stream writes its events: the
middlewares' wrappers of `send` only watch for the response's start, which still goes through them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from engine.core.request import Request as CoreRequest
from harness.serve.config import ServeConfig
from harness.serve.core import CoreStopped, QueueFull, ServeCore
from harness.serve.generation import Generation, HttpTimes
from harness.serve.intake import Intake
from harness.serve.metrics import ServerMetrics
from harness.serve.protocol import ChatCompletionRequest, CompletionRequest, error_body
from harness.serve.sse import Events, EventStream
from harness.serve.text import TextCodec

BodyT = TypeVar("BodyT", CompletionRequest, ChatCompletionRequest)


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


@dataclass
class Server:
    core: ServeCore
    codec: TextCodec
    config: ServeConfig
    model_name: str
    eos_stop_ids: tuple[int, ...]  # the checkpoint's eos ids past the first (stop tokens, as LLM does)
    metrics: ServerMetrics
    times: dict[str, HttpTimes] = field(default_factory=dict)  # every request taken, by request id

    def generation(self, body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int],
                   max_tokens: int | None, http_arrival: float) -> Generation:
        if body.model != self.model_name:
            raise BadRequest(f"model {body.model!r} is not served here; /v1/models lists {self.model_name!r}",
                             "model", 404)
        if max_tokens is None:
            max_tokens = self._default_max_tokens(len(prompt_ids))
        probe = CoreRequest("check", prompt_ids, body.sampling_params(max_tokens, ()))
        try:
            max_tokens = self.core.admission.check_fits(probe)  # the scheduler's own admission rule
        except ValueError as error:
            message = str(error).replace("request 'check': ", "").replace("request 'check'", "the request")
            raise BadRequest(message, "prompt") from None
        if body.min_tokens > max_tokens:
            raise BadRequest(f"min_tokens ({body.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens")
        vocab = self.core.info.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:  # two C loops: a long prompt's ids cost ~20 us
            raise BadRequest(f"prompt token ids must be in [0, {vocab})", "prompt")
        gen = Generation(self.core, self.codec, self.metrics, prompt_ids,
                         body.sampling_params(max_tokens, self.eos_stop_ids), body.stops, http_arrival)
        try:
            gen.submit()
        except (QueueFull, CoreStopped) as error:
            raise BadRequest(str(error), None, 503) from None
        self.times[gen.request_id] = gen.times
        return gen

    def _default_max_tokens(self, prompt_len: int) -> int | None:
        """serve.default_max_tokens, capped by the room max_model_len leaves and by what the whole
        KV cache holds (the last sampled token is never written to it): a cache smaller than
        max_model_len still serves a request that gives none. None: no room (admission says why)."""
        admission = self.core.admission
        blocks = admission.block_manager
        room = min(admission.config.max_model_len - prompt_len, blocks.num_blocks * blocks.block_size + 1 - prompt_len)
        return min(self.config.default_max_tokens, room) if room >= 1 else None


class Stamped:
    """The app, with each HTTP request's arrival time and the server's send in its scope; the
    requests of a burst go in one per turn of the loop (harness.serve.intake)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.intake = Intake()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            scope["harness.arrival"] = time.perf_counter()
            scope["harness.send"] = send
            await self.intake.turn()
        await self.app(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    """Errors in OpenAI's body: a body that fails validation as 400 naming the field at fault, a
    BadRequest with its own status (503: the server cannot serve now), anything else as 500."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        first = errors[0]
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        field = ".".join(loc) or None
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if (n := _union_depth(loc)) is not None:  # pydantic names each type it tried: prompt.str, ...
            field = ".".join(loc[:n]) or None
            where = [[str(p) for p in e.get("loc", ()) if p != "body"] for e in errors]
            tried = [f"{'.'.join(w[n:])}: {e['msg']}" for w, e in zip(where, errors) if w[:n] == loc[:n]]
            message = f"matches none of the types it may have ({'; '.join(tried)})"
        if first.get("type") == "extra_forbidden":
            message = f"unknown field {field!r}: this server does not accept it"
        elif first.get("type") == "json_invalid":
            message, field = f"the body is not valid JSON: {first.get('ctx', {}).get('error', message)}", None
        text = f"{field}: {message}" if field and not message.startswith("unknown field") else message
        return JSONResponse(error_body(text, 400, field), status_code=400)

    @app.exception_handler(Exception)
    async def _fault(request: Request, error: Exception) -> JSONResponse:
        # the server's own fault: still OpenAI's body, which clients parse (the traceback is logged)
        return JSONResponse(error_body(f"{type(error).__name__}: {error}", 500, None, "server_error"), status_code=500)

    @app.exception_handler(BadRequest)
    async def _bad(request: Request, error: BadRequest) -> JSONResponse:
        kind = "service_unavailable" if error.status == 503 else "invalid_request_error"
        return JSONResponse(error_body(str(error), error.status, error.param, kind), status_code=error.status)


def create_app(server: Server) -> Stamped:
    app = FastAPI(title="serving-harness", docs_url=None, redoc_url=None)

    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if not server.core.alive:
            return JSONResponse(error_body(f"the core process stopped: {server.core.error}", 500), status_code=500)
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": 0,
                                            "owned_by": "serving-harness",
                                            "max_model_len": server.core.admission.config.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/internal/state")
    async def state() -> dict:
        """What tests and the timing study read: which HTTP process answers (serve.api_servers), its
        held requests, the core's blocks, and this process's lag percentiles: dispatch (the HTTP
        side has a step's tokens) and send (a stream's event is with the socket)."""
        snap = server.core.snapshot
        return {"api_server": server.metrics.front, "live": snap.live, "running": snap.running,
                "waiting": snap.waiting, "used_blocks": snap.used_blocks,
                "http_cpu_s": time.process_time(),  # the HTTP process's CPU so far (the core's is its own)
                **_percentiles("lag", server.core.lags), **_percentiles("send_lag", server.core.send_lags)}

    @app.get("/internal/send_lags")
    async def send_lags() -> list[float]:
        """Each token's send lag in seconds, in the order the tokens went to their sockets (the
        latest LAG_SAMPLES): where in a run the lag is (experiments/serve/lag_pairs.py)."""
        return list(server.core.send_lags)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = _parse(CompletionRequest, await request.body())
        prompt = body.prompt if isinstance(body.prompt, list) else server.codec.encode(body.prompt)
        gen = server.generation(body, prompt, body.max_tokens, _arrival(request))
        return await _respond(server, gen, body, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = _parse(ChatCompletionRequest, await request.body())
        prompt = server.codec.chat([{"role": m.role, "content": m.text()} for m in body.messages])
        gen = server.generation(body, prompt, body.output_cap, _arrival(request))
        return await _respond(server, gen, body, request, chat=True)

    return Stamped(app)


def _union_depth(loc: list[str]) -> int | None:
    """Where an error's location names one type of a union (`prompt.str`,
    `messages.0.content.list[TextPart]`): how many parts come before that type; None if none does."""
    for i, part in enumerate(loc):
        if "[" in part or part in ("str", "int", "float", "bool", "none"):
            return i
    return None


def _parse(model: type[BodyT], raw: bytes) -> BodyT:
    """The body, parsed and validated by pydantic in one pass over the bytes (FastAPI's own route
    parsing decodes the JSON with the json module first: 0.5 ms for a 4,000-token prompt of ids);
    errors reach the same handler as FastAPI's."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in error.errors()]) from None


def _arrival(request: Request) -> float:
    return request.scope.get("harness.arrival") or time.perf_counter()


async def _respond(server: Server, gen: Generation, body, request: Request, chat: bool) -> Response:
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{gen.request_id}", "created": int(time.time()),
            "model": server.model_name}
    if body.stream:
        return EventStream(gen, Events(head, chat, body.include_usage, body.return_token_ids))
    text = await _unless_disconnected(gen.text(), request)
    if text is None:
        return Response(status_code=499)
    gen.sent(time.perf_counter())
    choice: dict = {"index": 0, "finish_reason": gen.finish_reason, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    if body.return_token_ids:
        choice["token_ids"] = gen.output_ids
        choice["prompt_token_ids"] = gen.prompt_ids
    obj = "chat.completion" if chat else "text_completion"
    return JSONResponse({**head, "object": obj, "choices": [choice], "usage": gen.usage()})


async def _unless_disconnected(work, request: Request) -> str | None:
    """work's result, or None (work cancelled, which aborts the request) if the client goes away."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def _percentiles(name: str, samples: Iterable[float]) -> dict:
    ordered = sorted(samples)

    def pick(q: float) -> float | None:
        return ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else None

    # min and P1: how early tokens went out (serve.max_early_ms); P99 and max: how late
    return {f"{name}_tokens": len(ordered), f"{name}_min_s": ordered[0] if ordered else None,
            f"{name}_p1_s": pick(0.01), f"{name}_p50_s": pick(0.5), f"{name}_p99_s": pick(0.99),
            f"{name}_max_s": ordered[-1] if ordered else None}
