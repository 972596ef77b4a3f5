"""One request on the asyncio side: submitted to the core loop, its tokens turned into text deltas.

Stop strings are the server's part, as in vLLM: the text is searched as it grows, and once a stop
string appears the text before it is the answer and the request is aborted in the core (its
blocks freed). While stop strings are set, the last (longest stop - 1) characters are held back so
a stop string never leaks into a stream.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from engine.core.request import FinishReason, Request
from engine.core.sampling_params import SamplingParams
from harness.serve.core import ServeCore
from harness.serve.delivery import Ahead, Delivery
from harness.serve.metrics import ServerMetrics
from harness.serve.text import TextCodec

_OPENAI_REASON = {FinishReason.LENGTH: "length", FinishReason.EOS: "stop", FinishReason.STOP: "stop",
                  FinishReason.ABORTED: "abort"}


@dataclass(slots=True)
class HttpTimes:
    """One request's way through the HTTP side, perf_counter() times (None: not reached)."""

    http_arrival: float  # the ASGI app was called (headers parsed; before the body is read)
    submitted: float | None = None  # handed to the core (the run's `arrival`)
    first_sent: float | None = None  # the first token's event handed to the socket
    send_lag_sum: float = 0.0  # over the request's tokens: written to the socket - due
    send_lag_tokens: int = 0


@dataclass
class Generation:
    core: ServeCore
    codec: TextCodec
    metrics: ServerMetrics
    prompt_ids: list[int]
    params: SamplingParams
    stops: list[str]
    http_arrival: float = field(default_factory=time.perf_counter)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self._pending: list[Delivery] = []  # received, not yet taken by deltas()
        self._waiter: asyncio.Future[None] | None = None  # deltas() waits on it while nothing is pending
        self._decoder = self.codec.decoder()
        self._text = ""  # decoded so far
        self._sent = 0  # characters of _text already given out
        self._holdback = max((len(s) for s in self.stops), default=1) - 1
        self._last_token: float | None = None
        self._done = False
        self._later = 0  # deliveries declined by prepare() for order, not yet taken
        self.times = HttpTimes(self.http_arrival)
        self.taken: list[tuple[float, int]] = []
        # set by a stream that writes each delivery as it comes (sse.EventStream): called in place
        # of waking deltas(), on the loop's pass over a step's tokens
        self.direct: Callable[[Delivery], None] | None = None
        # set by such a stream too: a text piece's Ahead with its event, made when a step arrives ahead
        self.encode: Callable[[str], Ahead] | None = None

    def submit(self) -> None:
        """Hand the request to the core (QueueFull when serve.max_queue is reached)."""
        request = Request(self.request_id, self.prompt_ids, self.params)
        self.core.submit(request, self._receive, self.prepare)
        self.times.submitted = time.perf_counter()

    def _receive(self, delivery: Delivery) -> None:
        now = time.perf_counter()
        metrics = self.metrics
        metrics.lag.observe(max(now - delivery.due, 0.0))
        n = len(delivery.token_ids)
        if n:
            if self._last_token is None:
                metrics.ttft.observe(now - self.http_arrival)
            else:
                metrics.itl.observe((now - self._last_token) / n, n)
            self._last_token = now
            metrics.tokens(n)
        if self.direct is not None:
            self.direct(delivery)
            return
        self._pending.append(delivery)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def deltas(self, keep_empty: bool = False) -> AsyncIterator[list[str]]:
        """Text as it comes, one piece per delivery; the deliveries that arrived while the consumer
        was busy come together (one write for a stream that fell behind). keep_empty: a delivery
        whose tokens add no text yet (an incomplete character, ids the tokenizer has no text for)
        still gives a piece, "", so a client timing tokens sees each one arrive. finish_reason is set
        when it ends; taken lists (due, tokens) of the deliveries taken since the latest sent().
        Aborts the request in the core if the consumer goes away (a disconnected client) or a stop
        string ends it."""
        loop = asyncio.get_running_loop()
        try:
            while not self._done:
                if not self._pending:
                    self._waiter = loop.create_future()
                    await self._waiter
                    self._waiter = None
                pieces = self.take(self.pending(), keep_empty)
                if pieces:
                    yield pieces
        finally:
            self.abort()

    @property
    def done(self) -> bool:
        return self._done

    def pending(self) -> list[Delivery]:
        """The deliveries received and not yet taken (emptied)."""
        batch, self._pending = self._pending, []
        return batch

    def take(self, batch: list[Delivery], keep_empty: bool = False) -> list[str]:
        """The text pieces of these deliveries (deltas() describes them), noted in `taken`."""
        pieces: list[str] = []
        for delivery in batch:
            if self._done:  # a stop string ended it; later deliveries are dropped
                break
            self.taken.append((delivery.due, max(len(delivery.token_ids), 1)))
            text = self._take(delivery)
            if text or (keep_empty and delivery.token_ids):
                pieces.append(text)
        return pieces

    def prepare(self, token_ids: list[int], reason: FinishReason | None) -> Ahead | None:
        """A delivery's text (and its event, with a stream's encode) as soon as its step arrives,
        ahead of its time (core.Prepare): then only the write is left when it is due (the
        finishing delivery's too: its stream writes the closing events after it). Declined (None;
        done when it is taken) when the text is not the delivery's alone (stop strings, which end
        the request when seen; once declined for these, every later one is too). Declined too
        (an Ahead with no text: decoded when taken) while an earlier delivery is still to be
        decoded: one that came without an offer before the stream began, or one declined so,
        whether its step is still held or it waits to be taken. The decoder takes tokens in order.
        A stream without stop strings holds nothing back, so the finishing delivery's text is its
        own as well."""
        if self.stops or self._done or not token_ids:
            return None
        if self._later or any(d.ahead is None for d in self._pending):
            self._later += 1
            return Ahead(None)
        text = self._decoder.add(token_ids)
        encode = self.encode
        return Ahead(text) if encode is None else encode(text)

    def abort(self) -> None:
        """The consumer went away: the request is aborted in the core (nothing if it ended)."""
        self.direct = self.encode = None  # (they hold its stream, which holds it)
        if not self._done:
            self._done = True
            self.finish_reason = "abort"
            self.core.abort(self.request_id)

    def sent(self, now: float) -> None:
        """What was taken since the last call is with the socket at now: its send lag, the first
        token's time."""
        times = self.times
        if self.output_ids and times.first_sent is None:
            times.first_sent = now
        lags = 0.0
        count = 0
        for due, n in self.taken:
            lags += (now - due) * n
            count += n
        times.send_lag_sum += lags
        times.send_lag_tokens += count
        self.core.sent(self.taken, now)
        self.taken = []

    async def text(self) -> str:
        return "".join([piece async for batch in self.deltas() for piece in batch])

    def _take(self, delivery: Delivery) -> str:
        self.output_ids.extend(delivery.token_ids)
        self.cached_tokens = delivery.cached_tokens
        ahead = delivery.ahead
        if ahead is not None and ahead.text is not None:
            self._text += ahead.text
        else:
            self._text += self._decoder.add(delivery.token_ids)
            if ahead is not None:  # declined for order (prepare)
                self._later -= 1
        end = len(self._text) - (0 if delivery.finish_reason else self._holdback)
        hit = self._stop_hit()
        if hit is not None:
            self._text = self._text[:hit]
            self._finish("stop", delivery)
            self.core.abort(self.request_id)
            end = hit
        elif delivery.finish_reason is not None:
            self._finish(_OPENAI_REASON[delivery.finish_reason], delivery)
            end = len(self._text)
        piece = self._text[self._sent:max(end, self._sent)]
        self._sent += len(piece)
        return piece

    def _stop_hit(self) -> int | None:
        if not self.stops:
            return None
        start = max(self._sent - self._holdback, 0)
        found = [i for i in (self._text.find(s, start) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _finish(self, reason: str, delivery: Delivery) -> None:
        self._done = True
        self.finish_reason = reason
        self.metrics.finished(len(self.prompt_ids), delivery.cached_tokens, len(self.output_ids), reason,
                              time.perf_counter() - self.http_arrival)

    def usage(self) -> dict[str, int]:
        prompt, output = len(self.prompt_ids), len(self.output_ids)
        usage = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}
        return usage
