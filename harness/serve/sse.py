"""A completion as server-sent events, and the response that writes them.

Each token's event is `prefix + json.dumps(text) + suffix` from a per-request template (no dict
built or encoded per token). A stream writes each delivery the moment the loop hands it over
(DirectWriter, Generation.direct): on the loop's one pass over a step's tokens, every stream's
event goes to its socket through the server's own `send` (the scope's "harness.send", set by
app.Stamped), with no task woken per stream and no middleware wrapper in between. The response
watches the connection itself: a client that goes away aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.responses import Response

from harness.serve.delivery import Ahead, Delivery
from harness.serve.generation import Generation

Send = Callable[[dict[str, Any]], Coroutine[Any, Any, None]]  # an ASGI send
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

    def delta(self, piece: str) -> bytes:
        return (self.prefix + json.dumps(piece) + self.suffix).encode()

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
        send = scope.get("harness.send", send)
        opening = self.events.opening()
        if opening is not None:
            await send({"type": "http.response.body", "body": opening, "more_body": True})
        writer = DirectWriter(send, self.gen, self.events)
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({writer.finished, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not writer.finished.done():  # the client went away (or the server stops): abort
                writer.close()
        if writer.finished.cancelled():
            return
        writer.finished.result()  # a failure of the stream is the server's error, logged as such
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class DirectWriter:
    """Writes a stream's events as its deliveries come, on the loop's one pass over a step's
    tokens (Generation.direct): no task wakes per stream per step. A write the server cannot take
    at once (its transport paused by flow control) finishes in a task, and what comes meanwhile
    follows it in one write. `finished` is done once the closing events are written."""

    def __init__(self, send: Send, gen: Generation, events: Events) -> None:
        self.send, self.gen, self.events = send, gen, events
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._backlog: list[bytes] | None = None  # None: no write waiting; else what follows it
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._queued: list[Delivery] = []  # taken in this pass over deliveries, written after it
        self._ahead = False  # the queued deliveries' events are written already (_write_ahead)
        self._written_at: float | None = None  # ... and when the socket took them
        gen.direct = self.deliver
        gen.encode = self._encode
        self.deliver_all(gen.pending())  # what came before the stream started

    def _encode(self, text: str) -> Ahead:
        """A delivery whose text is text, with its event (Generation.take's rule: none when it
        adds no text, unless every delivery is an event)."""
        body = self.events.delta(text) if text or self.events.token_ids else b""
        return Ahead(text, body, self._write_first)

    def _write_first(self, ahead: Ahead) -> None:
        """Write ahead's event at the start of its pass (core._pass, over one step: a step holds
        one delivery per request, so it is this stream's only one in the pass), before the
        deliveries are handed out; not once the request is done (aborted, or ended by the core)."""
        if self.gen.done or self.finished.done() or self._queued or ahead.body is None:
            return
        ahead.written = True
        if ahead.body:
            ahead.written_at = self._out(ahead.body, settle=False)

    def deliver(self, delivery: Delivery) -> None:
        queued = self._queued
        queued.append(delivery)
        if len(queued) == 1:  # one write per pass, whatever the steps it covers (a late server's)
            self.gen.core.defer(self._flush, self._write_ahead)

    def _write_ahead(self) -> None:
        """A pass's first round (core.defer): if every queued delivery's event was built when its
        step arrived (Generation.prepare), they go to the socket now; the rest (the text taken,
        the send noted) waits for _flush, after every stream of the pass has written."""
        if self.finished.done():
            return
        queued = self._queued
        if len(queued) == 1 and (one := queued[0].ahead) is not None and one.written:  # the usual case
            self._ahead = True
            self._written_at = one.written_at if one.body else None
            return
        aheads = [d.ahead for d in queued]
        if any(a is None or a.body is None for a in aheads):
            return
        self._ahead = True
        times = [a.written_at for a in aheads if a.written and a.body]  # type: ignore[union-attr]
        rest = b"".join([a.body for a in aheads if not a.written])  # type: ignore[union-attr,misc]
        if rest:
            times.append(self._out(rest, settle=False))
        # settled now if every event is with the socket; else when the waiting write is (_drained)
        self._written_at = None if not times or None in times else max(times)  # type: ignore[type-var]

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        if not self._ahead:
            self.deliver_all(batch)
            return
        written_at, self._ahead, self._written_at = self._written_at, False, None
        try:
            self.gen.take(batch, self.events.token_ids)  # text as deliver_all's, events written already
        except Exception as error:  # noqa: BLE001 - as in deliver_all
            self._fail(error)
            return
        if written_at is not None:
            self._sent(written_at)
        if self.gen.done:  # the finishing delivery's event is out: the closing events follow it
            self._close()

    def deliver_all(self, batch: list[Delivery]) -> None:
        if self.finished.done():
            return
        gen, events = self.gen, self.events
        try:
            # with return_token_ids (vLLM's extension) every delivery is an event, text or not: a
            # client timing tokens (experiments/serve/client.py) sees each one, random weights included
            pieces = gen.take(batch, events.token_ids) if batch else []
            body = events.deltas(pieces) if pieces else b""
            if gen.done and not self._closing:
                body += self._closing_events()
            if body:
                self._out(body)
        except Exception as error:  # noqa: BLE001 - the stream's own failure, raised by its response
            self._fail(error)

    def _closing_events(self) -> bytes:
        self._closing = True
        self.gen.direct = self.gen.encode = None
        return self.events.closing(self.gen)

    def _close(self) -> None:
        if self._closing or self.finished.done():
            return
        try:
            self._out(self._closing_events())
        except Exception as error:  # noqa: BLE001 - as in deliver_all
            self._fail(error)

    def close(self) -> None:
        """The client went away: abort the request, drop a waiting write."""
        self.gen.abort()
        if self._task is not None:
            self._task.cancel()
        if not self.finished.done():
            self.finished.cancel()

    def _out(self, body: bytes, settle: bool = True) -> float | None:
        """Write body, or queue it behind a waiting write; the time the socket took it (None: it
        waits). settle=False: the caller notes the send (_sent) itself."""
        if self._backlog is not None:
            self._backlog.append(body)
            return None
        task = write_now(self.send, {"type": "http.response.body", "body": body, "more_body": True})
        if task is None:
            now = time.perf_counter()
            if settle:
                self._sent(now)
            return now
        self._backlog, self._task = [], task
        task.add_done_callback(self._drained)
        return None

    def _drained(self, task: asyncio.Task[None]) -> None:
        backlog, self._backlog, self._task = self._backlog, None, None
        if task.cancelled():
            return
        if (error := task.exception()) is not None:
            self._fail(error)
        elif backlog:
            self._out(b"".join(backlog))
        else:
            self._sent()

    def _sent(self, now: float | None = None) -> None:
        # deliveries that gave no event of their own (the last, finishing one) count as sent too
        self.gen.sent(time.perf_counter() if now is None else now)
        if self._closing and not self.finished.done():
            self.finished.set_result(None)

    def _fail(self, error: BaseException) -> None:
        self.gen.abort()
        if not self.finished.done():
            self.finished.set_exception(error)


def write_now(send: Send, message: dict[str, Any]) -> asyncio.Task[None] | None:
    """Run the ASGI send(message) as far as it goes without waiting: None once done (the usual
    case: the server's transport took the bytes), else the task that finishes it."""
    coro = send(message)
    try:
        waited = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_resume(coro, waited))


async def _resume(coro: Coroutine[Any, Any, None], waited: Any) -> None:
    """Go on with a coroutine that stopped at waited (what it yielded), as a task would."""
    try:
        while True:
            if waited is None:  # a bare yield (asyncio.sleep(0))
                await asyncio.sleep(0)
            else:
                # a future yielded by an await is marked as blocking; a task clears the mark when
                # it takes one (awaiting it again while still marked and pending raises)
                waited._asyncio_future_blocking = False
                await waited
            try:
                waited = coro.send(None)
            except StopIteration:
                return
    finally:
        coro.close()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
