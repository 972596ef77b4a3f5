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
import gc
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
from harness.serve.delivery import Ahead, Delivery, Prepare, Sink
from harness.serve.wire import WireProtocol

# a step's tokens that arrive ahead of their time are timed to this much before it, then slept to:
# uvloop's timers count whole milliseconds against a clock read once per loop iteration, and fire
# up to 0.7 ms early or late on an idle loop (more behind other work); a timer aimed closer fired
# early, was set again for the rest, and that one fired late
TIMER_SLACK_S = 1.5e-3
LAG_SAMPLES = 1 << 20  # tokens whose lags are kept (two Python floats each: about 64 MiB at most)


class QueueFull(Exception):
    """serve.max_queue requests are already waiting or running."""


class CoreStopped(Exception):
    """The core process is gone (its error is in the message); nothing more can be served."""


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
        self._prepares: dict[str, Prepare] = {}  # of those, the ones that prepare ahead
        self._wire: WireProtocol | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._waiting: asyncio.Future | None = None  # the ready or result message
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held: deque[tuple] = deque()  # step messages not yet due, in order
        self._timer: asyncio.Handle | None = None  # the next _release, while one is set
        self._flushes: list[Callable[[], None]] | None = None  # during a pass: what defer() was given
        self._writes: list[Callable[[], None]] = []  # ... and its first round

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

    def submit(self, request: Request, sink: Sink, prepare: Prepare | None = None) -> None:
        """Queue request (its max_tokens already checked by the admission rule), arriving now.
        prepare, if given, is offered each of its deliveries in a step that arrives ahead."""
        if len(self._sinks) >= self.max_queue:
            raise QueueFull(f"the server holds serve.max_queue={self.max_queue} requests; retry later")
        if not self.alive or self._wire is None:
            raise CoreStopped(f"the core process is not running: {self.error}")
        stamp = time.perf_counter()
        request.arrival_time = stamp - self.origin
        self._sinks[request.request_id] = sink
        if prepare is not None:
            self._prepares[request.request_id] = prepare
        self.snapshot.live = len(self._sinks)
        self._wire.send(("add", request, stamp))

    def abort(self, request_id: str) -> None:
        self._prepares.pop(request_id, None)
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
            self._held.append((*message, self._prepare(message[2])))
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

    def _prepare(self, deliveries: list) -> list[Ahead | None] | None:
        """What each delivery's Prepare gives (in arrival order, so a request's text is decoded in
        order); None if no request of the step prepares ahead."""
        prepares = self._prepares
        if not prepares:
            return None
        out: list[Ahead | None] = []
        for rid, token_ids, reason, _ in deliveries:
            prepare = prepares.get(rid)
            out.append(None if prepare is None else prepare(token_ids, reason))
        return out

    def _pass(self, messages: list[tuple]) -> None:
        """One pass over these steps' deliveries: a stream that writes as tokens come (sse) writes
        what it got from all of them once, after the pass (defer). A pass over one step whose
        events were made ahead writes them first, before it hands the deliveries out. The cyclic
        garbage collector waits until the pass is over (a collection of the old generations takes
        tens of milliseconds; between passes it delays no token that is already due)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._pass_steps(messages)
        finally:
            if collecting:
                gc.enable()

    def _pass_steps(self, messages: list[tuple]) -> None:
        start = time.perf_counter()
        if len(messages) == 1 and messages[0][0] == "step" and messages[0][4] is not None:
            for ahead in messages[0][4]:
                if ahead is not None and ahead.write is not None:
                    ahead.write(ahead)
        flushes: list[Callable[[], None]] = []
        writes: list[Callable[[], None]] = []
        self._flushes, self._writes = flushes, writes
        try:
            for message in messages:
                self._dispatch(start, message[1], message[2], message[4] if message[0] == "step" else None)
        finally:
            self._flushes, self._writes = None, []
        for write in writes:
            write()
        for flush in flushes:
            flush()
        if messages[-1][0] == "step":
            self._snap(messages[-1][3])

    def defer(self, flush: Callable[[], None], write: Callable[[], None] | None = None) -> None:
        """Call flush at the end of the current pass over deliveries (now, outside of one); write,
        if given, before it, in a first round that runs every stream's write before any flush."""
        if self._flushes is None:
            if write is not None:
                write()
            flush()
            return
        if write is not None:
            self._writes.append(write)
        self._flushes.append(flush)

    def _dispatch(self, now: float, due: float, deliveries: list, prepared: list | None) -> None:
        """Hand each delivery to its sink; now: when the pass began (the step reached the loop)."""
        lag = now - due
        lags, sinks = self.lags, self._sinks
        for i, (rid, token_ids, reason, cached) in enumerate(deliveries):
            if reason is not None:
                sink = sinks.pop(rid, None)
                self._prepares.pop(rid, None)
            else:
                sink = sinks.get(rid)
            if sink is None:  # aborted here already
                continue
            lags.extend([lag] * max(len(token_ids), 1))
            if prepared is None:
                sink(Delivery(token_ids, reason, due, cached))
            else:
                sink(Delivery(token_ids, reason, due, cached, prepared[i]))
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
        self._prepares = {}
        for sink in sinks.values():
            sink(Delivery([], FinishReason.ABORTED, now))
        self.snapshot.live = 0
