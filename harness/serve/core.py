"""The server's one core loop: a thread that owns the scheduler and the executor.

HTTP handlers never touch the scheduler. They hand a request over (submit) or ask for one to go
(abort) through a thread-safe inbox; the loop thread takes both in between steps, drives the same
Replica a run does (engine.core.loop), and after each step hands every live request its new tokens
on the asyncio loop, in one callback per step. A request that finished or was aborted frees its
blocks in the scheduler as in a run.

The simulator's clock is paced: simulated time t is due at wall time origin + t / time_scale, and
a step whose simulated end lies ahead of the wall is slept to before its tokens go out, so clients
see the predicted latencies. How late each delivery reaches the asyncio loop (its lag behind the
schedule) is kept as a sample per token.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core import Executor
from engine.core.loop import Replica, StepRecord, WallClock
from engine.core.request import FinishReason, Request
from engine.core.scheduler import Scheduler

IDLE_POLL_S = 0.5  # an idle loop looks for a stop request this often


class QueueFull(Exception):
    """serve.max_queue requests are already waiting or running."""


class PacedClock:
    """Simulated seconds, each due on the wall at origin + t / time_scale (perf_counter's clock)."""

    def __init__(self, time_scale: float, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self.time_scale = time_scale
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def wall_now(self) -> float:
        """The simulated time the wall clock has reached."""
        return (time.perf_counter() - self.origin) * self.time_scale

    def due(self) -> float:
        """The perf_counter time the current simulated time is due at."""
        return self.origin + self._t / self.time_scale

    def advance(self, duration_s: float) -> None:
        self._t += duration_s
        self._sleep_until_due()

    def wait_until(self, t: float) -> None:
        self._t = max(self._t, t)
        self._sleep_until_due()

    def _sleep_until_due(self) -> None:
        delay = self.due() - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


@dataclass(slots=True)
class Delivery:
    """What one step gave one request: its new tokens, and why it stopped (None: it goes on)."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    due: float  # perf_counter time the tokens were scheduled for
    cached_tokens: int = 0


Sink = Callable[[Delivery], None]  # called on the asyncio loop


@dataclass(slots=True)
class _Live:
    request: Request
    sink: Sink
    sent: int = 0


@dataclass
class CoreSnapshot:
    """The loop's gauges after its latest step (read by /metrics from another thread)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    live: int = 0
    used_blocks: int = 0


@dataclass
class ServeCore:
    scheduler: Scheduler
    executor: Executor
    clock: WallClock | PacedClock
    max_queue: int
    aio_loop: asyncio.AbstractEventLoop
    snapshot: CoreSnapshot = field(default_factory=CoreSnapshot)
    aborted: list[Request] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)  # seconds behind schedule at dispatch, one per token
    send_lags: list[float] = field(default_factory=list)  # seconds behind schedule when a stream wrote it
    on_finish: Callable[[Request], None] | None = None  # called on the loop thread

    def __post_init__(self) -> None:
        self.replica = Replica(0, self.scheduler, self.executor, self.clock)
        self.replica.on_step = self._on_step
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}  # loop thread only
        self._count_lock = threading.Lock()
        self._count = 0  # submitted and not yet finished or aborted
        self._thread = threading.Thread(target=self._run, name="serve-core", daemon=True)
        self.error: BaseException | None = None
        self.num_blocks = self.executor.info().num_blocks

    # ---- from the HTTP side ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue request (its max_tokens already checked by the scheduler's rule), arriving now."""
        with self._count_lock:
            if self._count >= self.max_queue:
                raise QueueFull(f"the server holds serve.max_queue={self.max_queue} requests; retry later")
            self._count += 1
        clock = self.clock
        request.arrival_time = clock.wall_now() if isinstance(clock, PacedClock) else clock.now()
        self._inbox.put(("add", (request, sink)))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def stop(self, timeout_s: float = 30.0) -> None:
        """Abort what is left, end the loop thread and wait for it."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def sent(self, taken: list[tuple[float, int]]) -> None:
        """A stream handed the tokens of these (due, count) deliveries to its socket now."""
        now = time.perf_counter()
        for due, count in taken:
            self.send_lags.extend([now - due] * count)

    def lag_wall_due(self) -> float:
        clock = self.clock
        return clock.due() if isinstance(clock, PacedClock) else time.perf_counter()

    # ---- the loop thread ------------------------------------------------------------------

    def _run(self) -> None:
        replica = self.replica
        try:
            while self._take_inbox(block=replica.next_event_time() == math.inf):
                if replica.next_event_time() < math.inf:
                    replica.tick()
                    self._snap()
        except BaseException as error:  # the HTTP side reports it (/health) rather than hang
            self.error = error
            raise
        finally:
            for rid in list(self._live):
                self._abort(rid)

    def _take_inbox(self, block: bool) -> bool:
        """Move what the HTTP side sent into the replica; False once asked to stop."""
        inbox = self._inbox
        try:
            kind, item = inbox.get(timeout=IDLE_POLL_S) if block else inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if kind == "stop":
                return False
            if kind == "add":
                request, sink = item  # type: ignore[misc]
                self._live[request.request_id] = _Live(request, sink)
                self.replica.inbox.append(request)
            else:
                self._abort(str(item))
            try:
                kind, item = inbox.get_nowait()
            except queue.Empty:
                return True

    def _abort(self, request_id: str) -> None:
        live = self._live.pop(request_id, None)
        if live is None:  # finished already
            return
        request = live.request
        inbox = self.replica.inbox
        if request in inbox:
            inbox.remove(request)
            request.finish_reason = FinishReason.ABORTED
            request.finish_time = self.clock.now()
        else:
            self.scheduler.abort(request_id, self.clock.now())
        self.aborted.append(request)
        self._release(1)
        self._snap()

    def _release(self, n: int) -> None:
        with self._count_lock:
            self._count -= n

    def _on_step(self, index: int, record: StepRecord, finished: list[Request]) -> None:
        batch: list[tuple[Sink, Delivery]] = []
        due = self.lag_wall_due()
        for live in self._live.values():
            request = live.request
            end = len(request.token_ids) - request.num_pending_tokens
            start = request.num_prompt_tokens + live.sent
            if end > start or request.is_finished:
                live.sent += max(end - start, 0)
                reason = request.finish_reason if request.is_finished else None
                batch.append((live.sink, Delivery(request.token_ids[start:end], reason, due,
                                                  request.num_cached_tokens)))
        for request in finished:
            del self._live[request.request_id]
            if self.on_finish is not None:
                self.on_finish(request)
        if finished:
            self._release(len(finished))
        if batch:
            self.aio_loop.call_soon_threadsafe(self._dispatch, batch)

    def _dispatch(self, batch: list[tuple[Sink, Delivery]]) -> None:
        now = time.perf_counter()
        lags = self.lags
        for sink, delivery in batch:
            lags.extend([now - delivery.due] * max(len(delivery.token_ids), 1))
            sink(delivery)

    def _snap(self) -> None:
        scheduler = self.scheduler
        used = self.num_blocks - scheduler.block_manager.num_free_blocks
        self.snapshot = CoreSnapshot(scheduler.num_running, scheduler.num_waiting + len(self.replica.inbox),
                                     used / self.num_blocks if self.num_blocks else 0.0, len(self._live), used)
