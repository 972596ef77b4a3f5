"""The step loop shared by every backend: arrivals in, plan, execute, advance the clock, update.

The loop never reads a wall clock itself; a Clock does. The simulator's clock jumps by each
step's priced duration; the engine's is the wall clock. Because decisions depend only on the
order of events, an offline workload produces the same schedule under both clocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.async_scheduler import AsyncScheduler
from engine.core.executor import Executor, PendingStep
from engine.core.plan import StepPlan, StepResult, StepStats
from engine.core.request import Request
from engine.core.scheduler import Scheduler


class Clock(Protocol):
    def now(self) -> float: ...

    def advance(self, duration_s: float) -> None:
        """A step of this many seconds has just been executed."""

    def wait_until(self, t: float) -> None:
        """Nothing can run before t (the next arrival)."""


class SimulatedClock:
    def __init__(self) -> None:
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def advance(self, duration_s: float) -> None:
        self._t += duration_s

    def wait_until(self, t: float) -> None:
        self._t = max(self._t, t)


class WallClock:
    """Seconds since construction; advance() is a no-op because execute() really took the time."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, duration_s: float) -> None:
        pass

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)


@dataclass(slots=True)
class StepRecord:
    start_s: float  # when the step was planned (overlapped steps: when it began, its end less its duration)
    duration_s: float
    stats: StepStats
    idle_s: float | None = None  # overlapped steps: the device's wait for this step (StepResult.idle_s)


@dataclass
class RunResult:
    requests: list[Request]  # finished requests, in submission order (rejected ones are in `rejected`)
    steps: list[StepRecord]
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> error message
    makespan_s: float = 0.0


def run(
    scheduler: Scheduler,
    executor: Executor,
    requests: Iterable[Request],
    clock: Clock,
    on_step: Callable[[StepRecord, list[Request]], None] | None = None,
) -> RunResult:
    """Serve requests (sorted by arrival_time) to completion.

    A request that fails admission is recorded in RunResult.rejected with its error; the others
    are served as if it had never arrived. With an executor whose info().overlaps_steps is True,
    step N+1 is planned and submitted before step N's tokens are read (the scheduler must then be
    an engine.core.async_scheduler.AsyncScheduler, which make_scheduler picks); otherwise each
    step is executed and applied before the next is planned.
    """
    pending = sorted(requests, key=lambda r: r.arrival_time)
    order = {r.request_id: i for i, r in enumerate(pending)}
    result = RunResult(requests=[], steps=[])
    next_arrival = 0
    done: list[Request] = []
    overlap = step_overlap(scheduler, executor)
    in_flight: tuple[StepPlan, PendingStep, float] | None = None

    complete = _Completer(scheduler, clock, overlap, result.steps, done, on_step)

    while next_arrival < len(pending) or scheduler.has_unfinished():
        now = clock.now()
        next_arrival = _admit_arrivals(scheduler, pending, next_arrival, now, result.rejected)
        if not scheduler.has_unfinished():
            if in_flight is not None:  # it only computes tokens of requests that already stopped
                complete(in_flight[0], in_flight[1].result(), in_flight[2])
                in_flight = None
            elif next_arrival < len(pending):
                clock.wait_until(pending[next_arrival].arrival_time)
            continue
        plan = scheduler.schedule(now)
        if plan.is_empty:
            if in_flight is not None:
                # everything runnable waits on the step in flight (its tokens, its freed blocks)
                complete(in_flight[0], in_flight[1].result(), in_flight[2])
                in_flight = None
                continue
            # NOTE: an empty plan with work queued means the core is stuck; fail loudly, never spin.
            raise RuntimeError(f"scheduler produced an empty step with {scheduler.num_waiting} waiting and "
                               f"{scheduler.num_running} running requests")
        if overlap:
            submitted = executor.submit(plan)
            if in_flight is not None:
                complete(in_flight[0], in_flight[1].result(), in_flight[2])
            in_flight = (plan, submitted, now)
        else:
            complete(plan, executor.execute(plan), now)
    if in_flight is not None:
        complete(in_flight[0], in_flight[1].result(), in_flight[2])
    done.sort(key=lambda r: order[r.request_id])
    result.requests = done
    result.makespan_s = clock.now()
    return result


@dataclass(slots=True)
class _Completer:
    """Applies a finished step: advance the clock, hand the tokens to the scheduler, record it."""

    scheduler: Scheduler
    clock: Clock
    overlap: bool
    steps: list[StepRecord]
    done: list[Request]
    on_step: Callable[[StepRecord, list[Request]], None] | None

    def __call__(self, plan: StepPlan, step_result: StepResult, planned_at: float) -> None:
        self.clock.advance(step_result.duration_s)
        end = self.clock.now() - step_result.ready_age_s
        finished = self.scheduler.update(plan, step_result, end)
        # an overlapped step was planned while its predecessor ran: it started when it ended, less its duration
        start = end - step_result.duration_s if self.overlap else planned_at
        record = StepRecord(start, step_result.duration_s, plan.stats, step_result.idle_s)
        self.steps.append(record)
        self.done.extend(finished)
        if self.on_step is not None:
            self.on_step(record, finished)


def step_overlap(scheduler: Scheduler, executor: Executor) -> bool:
    """Whether steps overlap (info().overlaps_steps), checked against the scheduler's class."""
    overlap = executor.info().overlaps_steps
    if overlap and not isinstance(scheduler, AsyncScheduler):
        raise TypeError("an executor that overlaps steps needs an AsyncScheduler: build the scheduler with "
                        "make_scheduler(config, executor.info())")
    return overlap


def _admit_arrivals(scheduler: Scheduler, pending: list[Request], next_arrival: int, now: float,
                    rejected: dict[str, str]) -> int:
    """Hand the scheduler every request that has arrived by now; returns the next one's index."""
    while next_arrival < len(pending) and pending[next_arrival].arrival_time <= now:
        request = pending[next_arrival]
        next_arrival += 1
        try:
            scheduler.add(request)
        except ValueError as error:
            rejected[request.request_id] = str(error)
    return next_arrival
