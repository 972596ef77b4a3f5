"""A completion as server-sent events, and the response that writes them.

Each token's event is `prefix + json.dumps(text) + suffix` from a per-request template (no dict
built or encoded per token); the deliveries a stream had not yet written go out in one write.
EventStream writes its body through the server's own `send` (the scope's "harness.send", set by
app.Stamped), not through the middlewares' wrappers, and watches the connection itself: a client
that goes away cancels the writer, which closes the generator and aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from starlette.responses import Response

from harness.serve.generation import Generation

_SLOT = "\x00slot"  # no delta is this string; json.dumps writes it as "\u0000slot"


def chunk_template(head: dict, obj: str, chat: bool, usage_key: dict) -> tuple[str, str]:
    """The SSE event of a text delta split around the delta's JSON string."""
    choice: dict = {"index": 0, "delta": {"content": _SLOT}} if chat else {"index": 0, "text": _SLOT}
    choice.update({"logprobs": None, "finish_reason": None})
    event = f"data: {json.dumps({**head, 'object': obj, 'choices': [choice], **usage_key})}\n\n"
    prefix, suffix = event.split(json.dumps(_SLOT))
    return prefix, suffix


async def events(gen: Generation, body, head: dict, chat: bool) -> AsyncIterator[bytes]:
    """The stream's events; each time it is resumed, what it yielded before is with the socket."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    usage_key = {"usage": None} if body.include_usage else {}

    def chunk(delta: str | None, finish: str | None, extra: dict | None = None) -> bytes:
        if chat:
            choice: dict = {"index": 0, "delta": {} if delta is None else {"content": delta}}
        else:
            choice = {"index": 0, "text": delta or ""}
        choice.update({"logprobs": None, "finish_reason": finish, **(extra or {})})
        return f"data: {json.dumps({**head, 'object': obj, 'choices': [choice], **usage_key})}\n\n".encode()

    if chat:
        first = {**head, "object": obj, **usage_key,
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}]}
        yield f"data: {json.dumps(first)}\n\n".encode()
    prefix, suffix = chunk_template(head, obj, chat, usage_key)
    dumps = json.dumps
    clock = time.perf_counter
    # with return_token_ids (vLLM's extension) every delivery is an event, text or not: a client
    # timing tokens (experiments/serve/client.py) sees each one, random-weight models included
    pieces = gen.deltas(keep_empty=body.return_token_ids)
    try:
        async for batch in pieces:
            yield "".join([prefix + dumps(piece) + suffix for piece in batch]).encode()
            gen.sent(clock())
    finally:
        await pieces.aclose()  # a client gone mid-stream: the request is aborted now, not when collected
    extra = {"token_ids": gen.output_ids} if body.return_token_ids else None
    yield chunk(None if chat else "", gen.finish_reason, extra)
    gen.sent(clock())  # deliveries that gave no event of their own (the last, finishing one)
    if body.include_usage:
        yield f"data: {json.dumps({**head, 'object': obj, 'choices': [], 'usage': gen.usage()})}\n\n".encode()
    yield b"data: [DONE]\n\n"


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        super().__init__(None, 200)
        self.body_iterator = body

    def init_headers(self, headers=None) -> None:
        # a streamed body has no content-length: uvicorn sends it chunked
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        writer = asyncio.ensure_future(self._write(scope.get("harness.send", send)))
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({writer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not writer.done():
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
        if writer.cancelled():  # the client went away
            return
        writer.result()  # a failure of the stream is the server's error, logged as such
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, send) -> None:
        body = self.body_iterator
        try:
            async for data in body:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            await body.aclose()  # type: ignore[attr-defined]


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
