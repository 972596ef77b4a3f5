"""The step loop shared by every backend: arrivals in, plan, execute, advance the clock, update.

The loop never reads a wall clock itself; a Clock does. The simulator's clock jumps by each
step's priced duration; the engine's is the wall clock. Because decisions depend only on the
order of events, an offline workload produces the same schedule under both clocks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.core.async_scheduler import AsyncScheduler
from engine.core.clock import Clock, SimulatedClock, WallClock
from engine.core.executor import Executor, PendingStep
from engine.core.fast_forward import DecodeRunner, fast_forward
from engine.core.fast_forward_run import FastRun
from engine.core.intake import Intake
from engine.core.launch_log import LaunchRow
from engine.core.plan import StepPlan, StepResult, StepStats
from engine.core.records import ArrivalFeed, RequestRecords, StepTotals
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.step_log import StepLog, StepRecord, StepRun

__all__ = ["Clock", "FleetStepHook", "Replica", "RunResult", "SimulatedClock", "StepLog", "StepRecord", "StepRun",
           "WallClock", "run", "step_overlap", "tokens_left"]


@dataclass
class RunResult:
    requests: list[Request]  # finished requests, in submission order (rejected ones are in `rejected`)
    steps: StepLog  # (a list of StepRecords is taken as one)
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> error message
    makespan_s: float = 0.0
    # run(compact=True): finished requests as records (in finishing order, each with its submission
    # index), `requests` left empty; steps as totals when run(keep_steps=False), `steps` left empty
    records: RequestRecords | None = None
    step_totals: StepTotals | None = None
    # an engine fleet replica's LaunchRows (engine.core.launch_log), where its process kept them
    launches: list[LaunchRow] | None = None

    def __post_init__(self) -> None:
        steps: object = self.steps
        if not isinstance(steps, StepLog):
            self.steps = StepLog(steps)  # type: ignore[arg-type]  # a list of StepRecords


def tokens_left(request: Request) -> int:
    """Prompt tokens still to compute plus output tokens still to generate (a request not yet
    admitted with max_tokens=None counts no output: its cap is only known at admission)."""
    max_tokens = request.max_tokens if request.max_tokens is not None else 0
    return max(request.num_prompt_tokens - request.num_computed_tokens, 0) + \
        max(max_tokens - request.num_output_tokens, 0)


# replica index, the step it just finished (or the run of steps engine.core.fast_forward booked at
# once), the requests that step (the run's last) finished
FleetStepHook = Callable[[int, StepRecord | StepRun, list[Request]], None]


class Replica:
    """One core (scheduler) and its executor, fed through an inbox of requests in arrival order:
run() drives one alone, engine.core.fleet drives several behind a router."""

    def __init__(self, index: int, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        self.index = index
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.overlap = step_overlap(scheduler, executor)
        self.inbox: deque[Request] = deque()  # routed, not yet admitted; in arrival order
        self.in_flight: tuple[StepPlan, PendingStep, float] | None = None
        self.result = RunResult(requests=[], steps=StepLog())
        # run(compact=True): each request's submission index, from its submission to its record
        self.submitted: dict[str, int] | None = None
        self.on_step: FleetStepHook | None = None
        # No step may start at or after this (a fleet's next routing); the inbox's head bounds it too.
        self.stop_at = math.inf
        # Runs of identical decode steps are booked at once (engine.core.fast_forward) on a simulated
        # clock, by an executor that prices them so.
        self.runner = executor if isinstance(executor, DecodeRunner) and isinstance(clock, SimulatedClock) else None
        # an executor whose prices follow the device's recent work times an idle device's next step
        # on this clock (sim.power_limit)
        follow_clock = getattr(executor, "follow_clock", None)
        if follow_clock is not None:
            follow_clock(clock)
        self.fast: FastRun | None = None  # a booked run waiting at the horizon for the next tick
        # a multi-process fleet's request intake (engine.core.intake); None: the loop sees a request
        # at its arrival, as a single run's does
        self.intake: Intake | None = None

    # ---- what routers read ----------------------------------------------------------------

    def outstanding_requests(self) -> int:
        return len(self.scheduler.requests) + len(self.inbox)

    def outstanding_tokens(self) -> int:
        self.settle()
        return sum(map(tokens_left, self.scheduler.requests.values())) + sum(map(tokens_left, self.inbox))

    def settle(self) -> None:
        """Requests and steps as the step-by-step path has them: a booked run still open writes
        its requests out and closes (engine.core.fast_forward)."""
        if self.fast is not None:
            self.fast.close()

    # ---- the loop body --------------------------------------------------------------------

    def next_seen(self) -> float:
        """When this replica's loop sees the head of its (non-empty) inbox: at its arrival, or a fleet's
        intake after it, in one message with every request routed here at the same arrival (the
        engine's router sends a replica all its arrivals due at once together)."""
        inbox = self.inbox
        head = inbox[0]
        intake = self.intake
        if intake is None:
            return head.arrival_time
        t = head.arrival_time
        tokens = 0
        for request in inbox:
            if request.arrival_time != t:
                break
            tokens += request.num_prompt_tokens
        return t + intake.delay_s(tokens)

    def sees(self, now: float) -> bool:
        """Whether this replica's loop, iterating at `now`, sees the head of its inbox: one that
        is stepping (engine.core.intake) reads its pipe its intake's poll_lag_s after `now`."""
        seen = self.next_seen()
        intake = self.intake
        if intake is not None and (self.in_flight is not None or self.scheduler.has_unfinished()):
            seen -= intake.poll_lag_s
        return seen <= now

    def next_event_time(self) -> float:
        """When this replica's next iteration starts; inf when it has nothing to do."""
        now = self.clock.now()
        if self.scheduler.has_unfinished() or self.in_flight is not None:
            return self.plan_time()
        if self.inbox:
            return max(now, self.next_seen())
        return math.inf

    def plan_time(self) -> float:
        """When the loop admits arrivals and plans its next step: now, or, while a prefill step is in
        flight, not before that step's submit() returned (its host_s, at the time it was planned):
        the loop submits step N, then reads step N-1 and plans step N+1. An eager prefill's launches
        outlast the step before it on the device, and the engine admits what arrives meanwhile into
        step N+1 (experiments/fidelity/code_completion_h100/admission.md). A wall clock has waited
        for it already (its pending steps have no host_s; nor have a simulator's without
        backend.plan_after_launches). A decode step's submit, one graph launch,
        is not counted: it did not outlast the step before it in those cells (0 difference), and so
        the plan times of fast-forwarded runs of decode steps are the clock's."""
        now = self.clock.now()
        flight = self.in_flight
        if flight is None or flight[0].stats.kind == "decode":
            return now
        return max(now, flight[2] + getattr(flight[1], "host_s", 0.0))

    def admit(self, now: float) -> None:
        inbox = self.inbox
        while inbox and self.sees(now):
            arrival = inbox[0].arrival_time
            while inbox and inbox[0].arrival_time == arrival:  # one message (next_seen)
                request = inbox.popleft()
                try:
                    self.scheduler.add(request)
                except ValueError as error:
                    self.result.rejected[request.request_id] = str(error)
                    if self.submitted is not None:
                        del self.submitted[request.request_id]

    def tick(self) -> None:
        """One iteration: admit what has arrived, then plan and execute (or submit) a step (or, in
        a booked run, book on: engine.core.fast_forward)."""
        if self.fast is not None:
            if self.fast.resume():
                return
            if self.plan_time() >= self.stop_at:
                # the run closed at or past the fleet's bound: the next iteration comes after its event
                return
        now = self.plan_time()
        inbox = self.inbox
        if inbox and self.sees(now):
            self.admit(now)
        scheduler = self.scheduler
        if not scheduler.has_unfinished():
            if self.in_flight is not None:  # it only computes tokens of requests that already stopped
                self.finish_in_flight()
            elif self.inbox:
                self.clock.wait_until(self.next_seen())
            return
        plan = scheduler.schedule(now)
        if not plan.scheduled:  # plan.is_empty, without a property call on every step
            if self.in_flight is not None:
                self.finish_in_flight()
                return
            raise RuntimeError(f"replica {self.index}: scheduler produced an empty step with "
                               f"{scheduler.num_waiting} waiting and {scheduler.num_running} running requests")
        if self.overlap:
            submitted = self.executor.submit(plan)
            if self.in_flight is not None:
                self.finish_in_flight()
            self.in_flight = (plan, submitted, now)
        else:
            self.complete(plan, self.executor.execute(plan), now)
        if self.runner is not None and plan.stats.kind == "decode":
            self.fast = fast_forward(self, plan, self.runner)

    def horizon(self) -> float:
        """A step may start only before this: the next request the loop sees (a stepping loop's:
        Replica.sees), or the fleet's next routing."""
        inbox = self.inbox
        if not inbox:
            return self.stop_at
        intake = self.intake
        lag = intake.poll_lag_s if intake is not None else 0.0
        return min(self.stop_at, self.next_seen() - lag)

    def finish_in_flight(self) -> None:
        assert self.in_flight is not None, "only a step in flight can finish"
        plan, pending, planned_at = self.in_flight
        self.in_flight = None
        self.complete(plan, pending.result(), planned_at)

    def complete(self, plan: StepPlan, step_result: StepResult, planned_at: float) -> None:
        duration = step_result.duration_s
        clock = self.clock
        clock.advance(duration)
        end = clock.now() - step_result.ready_age_s
        finished = self.scheduler.update(plan, step_result, end)
        start = end - duration if self.overlap else planned_at
        self.record_step(start, duration, plan.stats, step_result.idle_s, finished)

    def record_step(self, start: float, duration: float, stats: StepStats, idle_s: float | None,
                    finished: list[Request]) -> None:
        self.record_steps(StepRecord(start, duration, stats, idle_s), finished)

    def record_steps(self, steps: StepRecord | StepRun, finished: list[Request]) -> None:
        """Keep a step (or a run of steps booked at once) and the requests it (its last) finished."""
        result = self.result
        totals = result.step_totals
        if totals is None:
            if isinstance(steps, StepRun):
                result.steps.add_run(steps)
            else:
                result.steps.append(steps)
        else:
            count = steps.num_steps if isinstance(steps, StepRun) else 1
            stats = steps.stats
            totals.count += count
            totals.prefill_tokens += stats.num_prefill_tokens * count
            totals.requests += stats.num_requests * count
        if finished:
            if result.records is None:
                result.requests.extend(finished)
            else:
                assert self.submitted is not None, "records need submission indices"
                for request in finished:
                    result.records.add(request, self.submitted.pop(request.request_id))
        if self.on_step is not None:
            self.on_step(self.index, steps, finished)


def run(
    scheduler: Scheduler,
    executor: Executor,
    requests: Iterable[Request],
    clock: Clock,
    on_step: Callable[[StepRecord | StepRun, list[Request]], None] | None = None,
    compact: bool = False,
    keep_steps: bool = True,
) -> RunResult:
    """Serve requests (sorted by arrival_time) to completion.

    A request that fails admission is recorded in RunResult.rejected with its error; the others
    are served as if it had never arrived. With an executor whose info().overlaps_steps is True,
    step N+1 is planned and submitted before step N's tokens are read (the scheduler must then be
    an engine.core.async_scheduler.AsyncScheduler, which make_scheduler picks); otherwise each
    step is executed and applied before the next is planned.

    compact=True: requests come already in arrival order (an iterator, read as the clock reaches
    each arrival, so they may be made on demand) and leave as RunResult.records, the Request
    objects released; keep_steps=False keeps RunResult.step_totals in place of the steps. Memory
    then follows the requests in flight, whatever the workload's length.
    """
    replica = Replica(0, scheduler, executor, clock)
    if on_step is not None:
        replica.on_step = lambda index, record, finished: on_step(record, finished)
    if not keep_steps:
        replica.result.step_totals = StepTotals()
    if compact:
        replica.submitted = {}
        replica.result.records = RequestRecords()
        replica.inbox = ArrivalFeed(iter(requests), replica.submitted)
        _serve(replica)
    else:
        pending = sorted(requests, key=lambda r: r.arrival_time)
        replica.inbox.extend(pending)
        _serve(replica)
        order = {r.request_id: i for i, r in enumerate(pending)}
        replica.result.requests.sort(key=lambda r: order[r.request_id])
    result = replica.result
    result.makespan_s = clock.now()
    return result


def _serve(replica: Replica) -> None:
    while replica.next_event_time() < math.inf:
        replica.tick()


def step_overlap(scheduler: Scheduler, executor: Executor) -> bool:
    """Whether steps overlap (info().overlaps_steps), checked against the scheduler's class."""
    overlap = executor.info().overlaps_steps
    if overlap and not isinstance(scheduler, AsyncScheduler):
        raise TypeError("an executor that overlaps steps needs an AsyncScheduler: build the scheduler with "
                        "make_scheduler(config, executor.info())")
    return overlap
