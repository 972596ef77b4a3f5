"""A completion as server-sent events, and the response that writes them.

Each token's event is `prefix + json.dumps(text) + suffix` from a per-request template (no dict
built or encoded per token); the deliveries a stream had not yet written go out in one write.
EventStream pulls the text deltas itself and writes them through the server's own `send` (the
scope's "harness.send", set by app.Stamped), not through the middlewares' wrappers: one coroutine
between a delivery and the socket. It watches the connection itself: a client that goes away
cancels the writer, which closes the deltas and so aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import time

from starlette.responses import Response

from harness.serve.generation import Generation

_SLOT = "\x00slot"  # no delta is this string; json.dumps writes it as "\u0000slot"


class Events:
    """The events of one streamed completion (chat or text, with or without usage)."""

    def __init__(self, head: dict, chat: bool, include_usage: bool, token_ids: bool) -> None:
        self.head, self.chat, self.token_ids = head, chat, token_ids
        self.obj = "chat.completion.chunk" if chat else "text_completion"
        self.usage_key = {"usage": None} if include_usage else {}
        self.include_usage = include_usage
        choice: dict = {"index": 0, "delta": {"content": _SLOT}} if chat else {"index": 0, "text": _SLOT}
        choice.update({"logprobs": None, "finish_reason": None})
        self.prefix, self.suffix = self._event({"choices": [choice]}).decode().split(json.dumps(_SLOT))

    def _event(self, fields: dict) -> bytes:
        return f"data: {json.dumps({**self.head, 'object': self.obj, **fields, **self.usage_key})}\n\n".encode()

    def opening(self) -> bytes | None:
        if not self.chat:
            return None
        return self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                         "finish_reason": None}]})

    def deltas(self, pieces: list[str]) -> bytes:
        prefix, suffix, dumps = self.prefix, self.suffix, json.dumps
        return "".join([prefix + dumps(piece) + suffix for piece in pieces]).encode()

    def closing(self, gen: Generation) -> bytes:
        """The finishing event (with the output's ids if asked for), the usage, [DONE]."""
        choice: dict = {"index": 0, "delta": {}} if self.chat else {"index": 0, "text": ""}
        choice.update({"logprobs": None, "finish_reason": gen.finish_reason})
        if self.token_ids:
            choice["token_ids"] = gen.output_ids
        out = self._event({"choices": [choice]})
        if self.include_usage:
            out += f"data: {json.dumps({**self.head, 'object': self.obj, 'choices': [], 'usage': gen.usage()})}\n\n" \
                .encode()
        return out + b"data: [DONE]\n\n"


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(self, gen: Generation, events: Events) -> None:
        super().__init__(None, 200)
        self.gen, self.events = gen, events

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
        gen, events, clock = self.gen, self.events, time.perf_counter
        opening = events.opening()
        if opening is not None:
            await send({"type": "http.response.body", "body": opening, "more_body": True})
        # with return_token_ids (vLLM's extension) every delivery is an event, text or not: a client
        # timing tokens (experiments/serve/client.py) sees each one, random-weight models included
        deltas = gen.deltas(keep_empty=events.token_ids)
        try:
            async for pieces in deltas:
                await send({"type": "http.response.body", "body": events.deltas(pieces), "more_body": True})
                gen.sent(clock())
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]  # gone mid-stream: abort the request now
        await send({"type": "http.response.body", "body": events.closing(gen), "more_body": True})
        gen.sent(clock())  # deliveries that gave no event of their own (the last, finishing one)


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
