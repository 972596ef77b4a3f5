"""The core process: the scheduler and the executor of a server, in a process of their own.

`python -m harness.serve` starts this module as a child (harness.serve.core.ServeCore) with one end
of a socket pair per HTTP process (serve.api_servers; several: harness.serve.wire.FanChannel). It
reads the run's config, builds the executor and the scheduler exactly as a run does
(harness.run.make_executor, engine.core.make_scheduler), says it is ready, then drives the same
Replica a run does (engine.core.loop): requests and aborts are taken between steps, and after each
step every live request's new tokens go back in one message.

Why a process: in the HTTP process the loop would share one GIL with the HTTP side, whose work per
streamed token (tens of microseconds) then adds to every step, and the more streams a slower step
keeps open, the slower the next step (docs/serving.md#the-core-process). Here it runs as a run's loop
does. It waits on the socket only when it has nothing to do (no timer, no polling interval).

The simulator's clock is paced: simulated time t is due at wall time origin + t / time_scale. A
step's tokens are known as soon as it is priced, so they go out at once, with the wall time they
are due at (the HTTP process holds them until then, harness.serve.core); the loop then sleeps until
that time before it takes new messages and plans the next step, as the step would have run. Times
cross the processes as perf_counter() values (CLOCK_MONOTONIC on Linux: one clock for the host).
"""

from __future__ import annotations

import gc
import math
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, cast

from engine.core import make_scheduler
from engine.core.executor import EarlyTokens
from engine.core.loop import Replica, RunResult, StepRecord, WallClock
from engine.core.request import FinishReason, Request
from engine.core.scheduler import Scheduler
from harness.serve.handoff import SWITCH_INTERVAL_S, TokenSender, Watch, early_rows
from harness.serve.wire import Channel, CoreChannel, FanChannel

if TYPE_CHECKING:
    from harness.output.recording import StepRecorder


class PacedClock:
    """Simulated seconds, each due on the wall at origin + t / time_scale (perf_counter's clock)."""

    def __init__(self, time_scale: float, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self.time_scale = time_scale
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def at(self, wall: float) -> float:
        """The simulated time a perf_counter() time maps to."""
        return (wall - self.origin) * self.time_scale

    def due(self) -> float:
        """The perf_counter time the current simulated time is due at."""
        return self.origin + self._t / self.time_scale

    def advance(self, duration_s: float) -> None:
        """The step's end; CoreLoop sleeps until it is due once its tokens are sent."""
        self._t += duration_s

    def wait_until(self, t: float) -> None:
        self._t = max(self._t, t)
        self.sleep_until_due()

    def sleep_until_due(self) -> None:
        self.sleep_until(self._t)

    def sleep_until(self, t: float) -> None:
        """Sleep until simulated time t is due (none if it is due already)."""
        delay = self.origin + t / self.time_scale - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


Clock = WallClock | PacedClock


def clock_at(clock: Clock, wall: float) -> float:
    """A perf_counter() time on the run's clock."""
    return clock.at(wall) if isinstance(clock, PacedClock) else wall - clock.origin


def due_now(clock: Clock) -> float:
    """The perf_counter() time the tokens of the step just done are due at: the simulator's
    scheduled time, or now for the engine (its tokens exist now)."""
    return clock.due() if isinstance(clock, PacedClock) else time.perf_counter()


class CoreLoop:
    """One replica fed by the HTTP process (module docstring); run() returns once told to stop."""

    def __init__(self, scheduler: Scheduler, executor, clock: Clock, channel: Channel,
                 recorder: StepRecorder | None = None, early_tokens: bool = False) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.channel = channel
        self.recorder = recorder
        # a recorder watches the replica's clock (harness.output.recording), as in a run
        self.replica = Replica(0, scheduler, executor, clock if recorder is None else recorder.watch(clock))
        self.replica.on_step = self._on_step
        self.live: dict[str, Request] = {}
        self.sent: dict[str, int] = {}  # output tokens already handed out, by request
        self.aborted: list[Request] = []
        self.num_blocks = executor.info().num_blocks
        self.handoff_s: list[float] = []  # per step with tokens: building and sending its message
        # overlapped steps: a thread sends each step's tokens as they exist (harness.serve.handoff)
        self.sender = TokenSender(channel) if early_tokens and self.replica.overlap else None
        self.watching: Watch | None = None  # the step in flight, watched by the sender

    def run(self) -> RunResult:
        replica = self.replica
        try:
            while self._take(block=replica.next_event_time() == math.inf):
                if replica.next_event_time() < math.inf:
                    replica.tick()
                    if self.sender is not None:
                        self._watch()
                    elif isinstance(self.clock, PacedClock):  # its tokens are out: now the step runs,
                        # and arrivals are taken when the loop plans again (Replica.plan_time)
                        self.clock.sleep_until(replica.plan_time())  # never before now
        finally:
            if self.sender is not None:
                self.sender.close()
        for rid in list(self.live):
            self._abort(rid)
        result = replica.result
        return RunResult(result.requests + self.aborted, result.steps, dict(result.rejected), self.clock.now())

    def _take(self, block: bool) -> bool:
        """Move what the HTTP process sent into the replica; False once told to stop (or orphaned)."""
        if block:
            began = time.perf_counter()
            messages = self.channel.wait()
            if self.recorder is not None:  # idle, as a run's sleep until the next arrival
                self.recorder.asleep_s += time.perf_counter() - began
        else:
            messages = self.channel.poll()
        aborted = False
        for message in messages:
            kind = message[0]
            if kind == "add":
                _, request, stamp = message
                request.arrival_time = clock_at(self.clock, stamp)
                self.live[request.request_id] = request
                self.sent[request.request_id] = 0
                self.replica.inbox.append(request)
            elif kind == "abort":
                aborted |= self._abort(message[1])
            else:  # "stop"
                return False
        if aborted:
            self.channel.send(("snap", self._snap()))
        return not self.channel.closed

    def _abort(self, request_id: str) -> bool:
        request = self.live.pop(request_id, None)
        if request is None:  # finished already
            return False
        del self.sent[request_id]
        inbox = self.replica.inbox
        if request in inbox:
            inbox.remove(request)
            request.finish_reason = FinishReason.ABORTED
            request.finish_time = self.clock.now()
        else:
            self.scheduler.abort(request_id, self.clock.now())
        self.aborted.append(request)
        return True

    def _watch(self) -> None:
        """Hand the step just submitted to the sender, with the entries whose tokens may go early."""
        in_flight = self.replica.in_flight
        if in_flight is None or self.sender is None or self.watching is not None:
            return  # nothing in flight, or the step in flight is watched already
        plan, pending, _ = in_flight
        self.watching = self.sender.watch(cast(EarlyTokens, pending), early_rows(plan, self.scheduler))

    def _sent_early(self) -> None:
        """Count the tokens the sender sent of the step just read (it is done with it by now, or
        about to be: the step's result is in)."""
        watch, self.watching = self.watching, None
        if watch is None:
            return
        watch.done.wait()
        sent = self.sent
        for rid in watch.sent:
            if rid in sent:
                sent[rid] += 1

    def _on_step(self, index: int, record: StepRecord, finished: list[Request]) -> None:
        began = time.perf_counter()
        if self.sender is not None:
            self._sent_early()
        deliveries = []
        sent = self.sent
        for rid, request in self.live.items():
            end = len(request.token_ids) - request.num_pending_tokens
            start = request.num_prompt_tokens + sent[rid]
            if end > start or request.is_finished:
                sent[rid] += max(end - start, 0)
                reason = request.finish_reason if request.is_finished else None
                deliveries.append((rid, request.token_ids[start:end], reason, request.num_cached_tokens))
        for request in finished:
            del self.live[request.request_id]
            del sent[request.request_id]
        if deliveries:
            self.channel.send(("step", due_now(self.clock), deliveries, self._snap()))
            self.handoff_s.append(time.perf_counter() - began)

    def _snap(self) -> tuple[int, int, int]:
        """(running, waiting, used blocks) for the HTTP side's gauges."""
        scheduler = self.scheduler
        used = self.num_blocks - scheduler.block_manager.num_free_blocks
        return scheduler.num_running, scheduler.num_waiting + len(self.replica.inbox), used


def serve_core(channel: Channel) -> None:
    """Read the config, build, report ready, loop, send the outcome's tables."""
    import pandas as pd

    from harness.output.metrics import requests_frame, steps_frame
    from harness.output.recording import StepRecorder
    from harness.run import make_executor

    messages = channel.wait()
    if not messages:
        return
    _, rc, time_scale, early_tokens = messages[0]
    try:
        executor = make_executor(rc)
        scheduler = make_scheduler(rc.scheduler, executor.info(), rc.cache)
    except (ValueError, TypeError) as error:  # the backend refused the configuration: one line
        channel.send(("error", type(error).__name__, str(error)))
        return
    try:
        clock: Clock = WallClock() if rc.backend == "engine" else PacedClock(time_scale)
        # the engine's steps get a run's columns (features, host_s, launch_s): the same hook, the
        # same per-step work as `python -m harness backend=engine`
        recorder = None
        if rc.backend == "engine":
            recorder = StepRecorder(executor.info().graph_sizes, wall=True)
            executor.observe(recorder)
        sender = rc.backend == "engine" and early_tokens
        if sender:  # the token sender gets the GIL soon when it has tokens (harness.serve.handoff)
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        loop = CoreLoop(scheduler, executor, clock, channel, recorder, early_tokens=sender)
        # the loop makes no reference cycles (as in a run, harness.run.cyclic_gc_paused): no
        # collector pauses between steps; what was built so far is never scanned again
        gc.freeze()
        if rc.backend != "engine":
            gc.disable()
        channel.send(("ready", executor.info(), clock.origin))
        result = loop.run()
        if not channel.closed:
            steps = steps_frame(result)
            if recorder is not None:
                steps = pd.concat([steps, recorder.frame()], axis=1)
            channel.send(("result", requests_frame(result), steps, result.makespan_s, loop.handoff_s))
    except BaseException as error:
        if not channel.closed:
            channel.send(("error", type(error).__name__, f"the core loop stopped: {error!r}"))
        raise
    finally:
        executor.shutdown()


def main(argv: list[str]) -> None:
    # Ctrl-C reaches the whole process group: the HTTP process decides when this one stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    socks = [socket.socket(fileno=int(fd)) for fd in argv]  # one per HTTP process (serve.api_servers)
    try:
        serve_core(CoreChannel(socks[0]) if len(socks) == 1 else FanChannel(socks))
    finally:
        for sock in socks:
            sock.close()


if __name__ == "__main__":
    main(sys.argv[1:])
