"""How the HTTP process hands out the core's steps (harness.serve.core.ServeCore's half that runs
on the asyncio loop for every token).

A step's message is held until it is due (a simulator's step arrives ahead of its time), then
handed out in one pass with every other step due by then. The pass over a step writes its streams'
events one after another, which takes a measurable while (about 10 us of wall time each over
loopback): it starts that while before the step's time (at most max_early_s, serve.max_early_ms),
so that the last stream's write lands at the time rather than after it, and the earliest that much
before it. In the pass, each delivery goes to its request's sink, and a stream that writes as
tokens come writes what it got from the whole pass once, after it (defer). The lag of each token
behind its schedule is kept (`lags`; negative for a token handed out before its time).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from harness.serve.delivery import Ahead, Delivery, Prepare, Sink

# a step's tokens that arrive ahead of their time are timed to this much before it, then slept to:
# uvloop's timers count whole milliseconds against a clock read once per loop iteration, and fire
# up to 0.7 ms early or late on an idle loop (more behind other work); a timer aimed closer fired
# early, was set again for the rest, and that one fired late
TIMER_SLACK_S = 1.5e-3
# ... in slices of at most this, the loop's other work running between them: a new request's bytes
# and its handler wait for a sleep to end, and a request takes a few loop iterations to reach the
# app, so one sleep of the whole fraction (up to 3 ms before every step) would hold each arrival
# several ms longer than the engine's server does (docs/serving.md#arrivals-wait-for-no-step)
SLEEP_SLICE_S = 2e-4
WRITE_PASSES = 16  # the passes the expected write time per delivery is averaged over (about)
LAG_SAMPLES = 1 << 20  # tokens whose lags are kept (two Python floats each: about 64 MiB at most)


@dataclass
class CoreSnapshot:
    """The core's gauges after its latest step."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    live: int = 0
    used_blocks: int = 0


class StepPasses:
    """The held steps and the passes over them; ServeCore adds requests' sinks (and their
    Prepares) as they are submitted and sets the loop when it starts."""

    def __init__(self) -> None:
        self.snapshot = CoreSnapshot()
        self.num_blocks = 0  # the KV cache's, for snapshot.kv_usage
        self.lags: deque[float] = deque(maxlen=LAG_SAMPLES)  # seconds behind schedule at dispatch, per token
        self._sinks: dict[str, Sink] = {}  # submitted and not yet finished or aborted
        self._prepares: dict[str, Prepare] = {}  # of those, the ones that prepare ahead
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held: deque[tuple] = deque()  # step messages not yet due, in order
        self._timer: asyncio.Handle | None = None  # the next _release, while one is set
        self._flushes: list[Callable[[], None]] | None = None  # during a pass: what defer() was given
        self._writes: list[Callable[[], None]] = []  # ... and its first round
        self.max_early_s = 0.0  # the most a step's pass may start before its time (serve.max_early_ms)
        self._write_s = 0.0  # the first round's wall time per delivery, a moving average
        # a held step's gauges are older than a "snap" that arrived after it (an abort's): each
        # step or snap message gets its arrival number, and the snapshot keeps the newest one's
        self._arrivals = 0
        self._snap_arrival = 0
        self.after_pass: Callable[[], None] | None = None  # e.g. the metrics' row on a shared board
        self.passing = False  # within _pass (after_pass follows)

    def _hold(self, message: tuple) -> None:
        """A "step" message: held (with what its deliveries' Prepares give) until it is due."""
        self._arrivals += 1
        self._held.append((*message, self._prepare(message[2]), self._arrivals))
        if self._timer is None and self._loop is not None:  # after the rest of this read
            self._timer = self._loop.call_soon(self._release)

    def _release(self, everything: bool = False) -> None:
        """Hand out every held step that is due (_release_at), in one pass, and time the next. The
        loop's timer counts whole milliseconds and may fire early: the last fraction is slept, a
        slice at a time."""
        self._timer = None
        held = self._held
        now = time.perf_counter()
        if held and not everything and 0 < (wait := self._release_at(held[0]) - now) <= 2 * TIMER_SLACK_S:
            time.sleep(min(wait, SLEEP_SLICE_S))
            now = time.perf_counter()
            if self._release_at(held[0]) > now and self._loop is not None:  # other work, then the next slice
                self._timer = self._loop.call_soon(self._release)
                return
        due = []
        while held and (everything or self._release_at(held[0]) <= now):
            due.append(held.popleft())
        if due:
            self._pass(due)
        if held and self._loop is not None:
            delay = self._release_at(held[0]) - time.perf_counter() - TIMER_SLACK_S
            self._timer = self._loop.call_later(delay, self._release) if delay > 0 else \
                self._loop.call_soon(self._release)

    def _release_at(self, message: tuple) -> float:
        """When a held step's pass starts: its time less the wall time its writes are expected to
        take (each delivery's, as measured over past passes), at most max_early_s, so that the
        step's last write lands at its time rather than that much after it."""
        return message[1] - min(self.max_early_s, self._write_s * len(message[2]))

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
        self.passing = True
        try:
            self._pass_steps(messages)
        finally:
            self.passing = False
            if collecting:
                gc.enable()
        if self.after_pass is not None:
            self.after_pass()

    def _pass_steps(self, messages: list[tuple]) -> None:
        start = time.perf_counter()
        if len(messages) == 1 and messages[0][0] == "step" and messages[0][4] is not None:
            for ahead in messages[0][4]:
                if ahead is not None and ahead.write is not None:
                    ahead.write(ahead)
            # the wall time per delivery of this first round, averaged over about WRITE_PASSES passes
            per_delivery = (time.perf_counter() - start) / max(len(messages[0][4]), 1)
            self._write_s += (per_delivery - self._write_s) / WRITE_PASSES
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
            self._snap(messages[-1][3], messages[-1][5])

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

    def _snap(self, snap: tuple[int, int, int], arrival: int | None = None) -> None:
        """Set the gauges from snap, unless a newer one is set already; arrival: the message's
        number (_hold's), None for a snap message, which is the newest there is."""
        if arrival is None:
            self._arrivals += 1
            arrival = self._arrivals
        if arrival < self._snap_arrival:
            return
        self._snap_arrival = arrival
        running, waiting, used = snap
        s = self.snapshot
        s.running, s.waiting, s.used_blocks = running, waiting, used
        s.kv_usage = used / self.num_blocks if self.num_blocks else 0.0
