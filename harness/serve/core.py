"""The HTTP process's handle on the core process (harness.serve.core_loop).

HTTP handlers never touch the scheduler that runs. They hand a request over (submit) or ask for one
to go (abort); each is a message the core process takes between steps. After each step it sends
every live request's new tokens in one message, which this side hands to the requests' sinks in
one pass on the asyncio loop. Admission is checked here, before a request is sent, by a scheduler
built from the same config and cache size (check_fits reads only those).

Times cross as perf_counter() values: a delivery's `due` is when its tokens were scheduled for (the
simulator's paced time, or the engine's step end). The simulator's steps arrive ahead of their time
and wait on the loop's timer, so at that time the HTTP side need not wait for the core process to
wake, build and send them. How late they reach the HTTP side (`lags`)
and a stream's socket (`send_lags`) is kept as one sample per token, for the latest LAG_SAMPLES
tokens (a server that runs for hours keeps a bounded window).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from engine.core import BackendInfo, make_scheduler
from engine.core.request import FinishReason, Request
from engine.core.scheduler import Scheduler
from harness.config import RunConfig
from harness.serve.wire import WireProtocol

# a step's tokens that arrive ahead of their time are timed to this much before it, then slept to
# (asyncio's and uvloop's timers count whole milliseconds)
TIMER_SLACK_S = 5e-4
LAG_SAMPLES = 1 << 20  # tokens whose lags are kept (two Python floats each: about 64 MiB at most)


class QueueFull(Exception):
    """serve.max_queue requests are already waiting or running."""


class CoreStopped(Exception):
    """The core process is gone (its error is in the message); nothing more can be served."""


@dataclass(slots=True)
class Delivery:
    """What one step gave one request: its new tokens, and why it stopped (None: it goes on)."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    due: float  # perf_counter time the tokens were scheduled for
    cached_tokens: int = 0


Sink = Callable[[Delivery], None]  # called on the asyncio loop


@dataclass
class CoreSnapshot:
    """The core's gauges after its latest step."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    live: int = 0
    used_blocks: int = 0


@dataclass
class CoreResult:
    """What the core process served, as a run's tables (harness.output.metrics)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    makespan_s: float
    handoff_s: list[float]  # per step with tokens: the core process's time to build and send them


class ServeCore:
    """start() spawns the core process and waits until it is ready; stop() ends it and returns its
    tables. Everything else is called on the asyncio loop."""

    def __init__(self, rc: RunConfig, time_scale: float, max_queue: int) -> None:
        self.rc = rc
        self.time_scale = time_scale
        self.max_queue = max_queue
        self.snapshot = CoreSnapshot()
        self.lags: deque[float] = deque(maxlen=LAG_SAMPLES)  # seconds behind schedule at dispatch, per token
        self.send_lags: deque[float] = deque(maxlen=LAG_SAMPLES)  # ... when a stream wrote it, per token
        self.error: str | None = None
        self.origin = 0.0  # perf_counter() time 0 of the core's clock
        self._sinks: dict[str, Sink] = {}  # submitted and not yet finished or aborted
        self._wire: WireProtocol | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._waiting: asyncio.Future | None = None  # the ready or result message
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held: deque[tuple] = deque()  # step messages not yet due, in order
        self._timer: asyncio.Handle | None = None  # the next _release, while one is set
        self._flushes: list[Callable[[], None]] | None = None  # during a pass: what defer() was given

    # ---- lifetime ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn `python -m harness.serve.core_loop` and wait until its executor is built. A
        configuration the backend refuses raises ValueError or TypeError with its message."""
        import socket

        self._loop = loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        with theirs:
            self._proc = subprocess.Popen([sys.executable, "-m", "harness.serve.core_loop", str(theirs.fileno())],
                                          pass_fds=(theirs.fileno(),))
        _, self._wire = await loop.create_unix_connection(lambda: WireProtocol(self._on_message, self._on_lost),
                                                          sock=ours)
        self._waiting = loop.create_future()
        self._wire.send(("config", self.rc, self.time_scale))
        info, self.origin = await self._waiting
        self.info: BackendInfo = info
        self.num_blocks = info.num_blocks
        # the admission rule's own object: reads only the config and the cache size
        self.admission: Scheduler = make_scheduler(self.rc.scheduler, info, self.rc.cache)

    async def stop(self) -> CoreResult | None:
        """Abort what is left, end the core process and return what it served (None if it died)."""
        result = None
        if self.alive and self._wire is not None and self._loop is not None:
            self._waiting = self._loop.create_future()
            self._wire.send(("stop",))
            try:
                result = await self._waiting
            except RuntimeError:
                result = None
        if self._proc is not None:
            await asyncio.to_thread(self._proc.wait)
        if self._wire is not None and self._wire.transport is not None:
            self._wire.transport.close()
        return result

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and self.error is None

    # ---- from the HTTP side ------------------------------------------------------------------

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue request (its max_tokens already checked by the admission rule), arriving now."""
        if len(self._sinks) >= self.max_queue:
            raise QueueFull(f"the server holds serve.max_queue={self.max_queue} requests; retry later")
        if not self.alive or self._wire is None:
            raise CoreStopped(f"the core process is not running: {self.error}")
        stamp = time.perf_counter()
        request.arrival_time = stamp - self.origin
        self._sinks[request.request_id] = sink
        self.snapshot.live = len(self._sinks)
        self._wire.send(("add", request, stamp))

    def abort(self, request_id: str) -> None:
        if self._sinks.pop(request_id, None) is not None and self._wire is not None:
            self.snapshot.live = len(self._sinks)
            self._wire.send(("abort", request_id))

    def sent(self, taken: list[tuple[float, int]], now: float) -> None:
        """A stream handed the tokens of these (due, count) deliveries to its socket at now."""
        for due, count in taken:
            self.send_lags.extend([now - due] * count)

    # ---- from the core process -------------------------------------------------------------

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "tokens":  # a step's tokens, ahead of its "step" (harness.serve.handoff)
            self._pass([message])
        elif kind == "step":
            self._held.append(message)
            if self._timer is None and self._loop is not None:  # after the rest of this read
                self._timer = self._loop.call_soon(self._release)
        elif kind == "snap":
            self._snap(message[1])
        elif kind == "ready":
            self._resolve((message[1], message[2]))
        elif kind == "result":
            self._release(everything=True)
            self._resolve(CoreResult(*message[1:]))
        else:  # "error"
            self._failed(message[1], message[2])

    def _release(self, everything: bool = False) -> None:
        """Hand out every held step that is due, in one pass, and time the next. The loop's timer
        counts whole milliseconds and may fire early: the last fraction is slept."""
        self._timer = None
        held = self._held
        now = time.perf_counter()
        if held and 0 < held[0][1] - now <= 2 * TIMER_SLACK_S:
            time.sleep(held[0][1] - now)
            now = time.perf_counter()
        due = []
        while held and (everything or held[0][1] <= now):
            due.append(held.popleft())
        if due:
            self._pass(due)
        if held and self._loop is not None:
            delay = held[0][1] - time.perf_counter() - TIMER_SLACK_S
            self._timer = self._loop.call_later(delay, self._release) if delay > 0 else \
                self._loop.call_soon(self._release)

    def _pass(self, messages: list[tuple]) -> None:
        """One pass over these steps' deliveries: a stream that writes as tokens come (sse) writes
        what it got from all of them once, after the pass (defer)."""
        flushes: list[Callable[[], None]] = []
        self._flushes = flushes
        try:
            for message in messages:
                self._dispatch(message[1], message[2])
        finally:
            self._flushes = None
        for flush in flushes:
            flush()
        if messages[-1][0] == "step":
            self._snap(messages[-1][3])

    def defer(self, flush: Callable[[], None]) -> None:
        """Call flush at the end of the current pass over deliveries (now, outside of one)."""
        if self._flushes is None:
            flush()
        else:
            self._flushes.append(flush)

    def _dispatch(self, due: float, deliveries: list) -> None:
        now = time.perf_counter()
        lag = now - due
        lags, sinks = self.lags, self._sinks
        for rid, token_ids, reason, cached in deliveries:
            sink = sinks.pop(rid, None) if reason is not None else sinks.get(rid)
            if sink is None:  # aborted here already
                continue
            lags.extend([lag] * max(len(token_ids), 1))
            sink(Delivery(token_ids, reason, due, cached))
        self.snapshot.live = len(sinks)

    def _snap(self, snap: tuple[int, int, int]) -> None:
        running, waiting, used = snap
        s = self.snapshot
        s.running, s.waiting, s.used_blocks = running, waiting, used
        s.kv_usage = used / self.num_blocks if self.num_blocks else 0.0

    def _resolve(self, value: object) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(value)

    def _failed(self, kind: str, text: str) -> None:
        self.error = f"{kind}: {text}"
        error_type = {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(error_type(text))
        self._end_streams()

    def _on_lost(self, exc: Exception | None) -> None:
        if self.error is None and (self._waiting is None or not self._waiting.done()):
            self._failed("RuntimeError", f"the core process exited ({exc or 'its socket closed'})")
        self._end_streams()

    def _end_streams(self) -> None:
        """Requests in flight end as aborted: their streams close rather than hang."""
        now = time.perf_counter()
        sinks, self._sinks = self._sinks, {}
        for sink in sinks.values():
            sink(Delivery([], FinishReason.ABORTED, now))
        self.snapshot.live = 0
