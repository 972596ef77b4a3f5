"""An elastic fleet: replicas that start (a priced cold start), serve, drain and stop as an
autoscaling policy asks, on one event clock.

It is engine.core.fleet.run_fleet with three more kinds of event besides arrivals: a policy
evaluation every `interval_s`, a starting replica becoming ready, and a draining replica running
out of work. Arrivals are routed only to serving replicas, so a replica takes no traffic before
its start-up has passed; a draining one gets nothing new and stops when its last request ends.
With min_replicas == max_replicas nothing ever starts or drains, and the run is run_fleet's
(replicas only interact through the router, so evaluations in between arrivals change nothing).

A replica's life: requested (start-up begins, billed) -> ready (serving) -> drain -> stop.
A replica still starting when the policy scales down is cancelled (it stops at once, never served).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.fleet import FleetResult, _in_submission_order, _route, _run_until
from engine.core.loop import FleetStepHook, Replica, StepRecord, StepRun
from engine.core.request import Request
from engine.core.routers import Router


@dataclass(frozen=True)
class ColdStart:
    """A new replica's start-up, in seconds: provisioning (a machine, a container), loading the
    weights, capturing CUDA graphs, and the rest of the engine's own start (process_s: the
    interpreter and its imports, sizing and allocating the KV cache). It takes traffic after total_s."""

    provision_s: float = 0.0
    load_s: float = 0.0
    capture_s: float = 0.0
    process_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.provision_s + self.process_s + self.load_s + self.capture_s


@dataclass(frozen=True)
class Scaling:
    """How the fleet scales: bounds, how often the policy is asked, cooldowns (an action waits this
    long after the previous action of either direction), how many replicas one evaluation may drain,
    and the sliding window of finished requests the policy sees."""

    min_replicas: int
    max_replicas: int
    interval_s: float
    scale_up_cooldown_s: float
    scale_down_cooldown_s: float
    max_scale_down: int
    window_s: float
    cold_start: ColdStart


@dataclass(frozen=True)
class ReplicaSignal:
    running: int
    waiting: int  # queued in the scheduler or routed and not yet admitted
    kv_used: float  # fraction of KV blocks in use, 0-1


@dataclass(frozen=True)
class FleetSignal:
    """What a policy sees at an evaluation: each serving replica's load, how many are starting and
    draining, the TTFT and TPOT of requests finished within the window, and how long each request
    still waiting for its first token has waited (its TTFT will be at least that)."""

    now: float
    serving: tuple[ReplicaSignal, ...]
    starting: int
    draining: int
    ttfts: tuple[float, ...]
    tpots: tuple[float, ...]
    waiting_ages: tuple[float, ...]


def scale_by(want: int, current: int, since_last_action_s: float, scaling: Scaling) -> int:
    """How many replicas to start (> 0) or to take away (< 0) now: the policy's wish clamped to
    [min_replicas, max_replicas], an action waiting its cooldown after the previous one of either
    direction, at most max_scale_down taken away at once."""
    want = min(max(want, scaling.min_replicas), scaling.max_replicas)
    if want > current and since_last_action_s >= scaling.scale_up_cooldown_s:
        return want - current
    if want < current and since_last_action_s >= scaling.scale_down_cooldown_s:
        return -min(current - want, scaling.max_scale_down)
    return 0


def finished_latencies(r: Request) -> tuple[float, float, float] | None:
    """(finish, TTFT, TPOT or NaN for a one-token output) of a finished request, as a policy's
    window holds them; None for one that never produced a token."""
    if r.first_token_time is None or r.finish_time is None:
        return None
    decode = r.num_output_tokens - 1
    tpot = (r.finish_time - r.first_token_time) / decode if decode > 0 else math.nan
    return r.finish_time, r.first_token_time - r.arrival_time, tpot


class ScalingPolicy(Protocol):
    def desired(self, signal: FleetSignal) -> int:
        """How many replicas (serving + starting) the fleet should have; the fleet clamps it to
        [min_replicas, max_replicas] and applies the cooldowns."""


@dataclass
class Lifetime:
    index: int
    requested_s: float
    ready_s: float
    drain_s: float | None = None
    stop_s: float | None = None  # None until it stops; the run's end for those still serving then
    cancelled: bool = False  # stopped while still starting


@dataclass(frozen=True)
class ScaleEvent:
    time_s: float
    direction: str  # "up" or "down"
    replicas: tuple[int, ...]  # the replicas started, or drained / cancelled


@dataclass
class ElasticResult:
    fleet: FleetResult
    lifetimes: list[Lifetime]
    events: list[ScaleEvent] = field(default_factory=list)


class FleetStates:
    """The bookkeeping a simulated (run_elastic) and an engine (engine.core.elastic_wall) elastic
    fleet share: which replicas are starting, serving and draining, their lifetimes, the scale
    events, the window of finished requests a policy sees, and how an evaluation acts."""

    def __init__(self, scaling: Scaling, policy: ScalingPolicy | None) -> None:
        self.scaling = scaling
        self.policy = policy
        self.lifetimes: list[Lifetime] = []
        self.serving: list[int] = []
        self.starting: list[int] = []
        self.draining: list[int] = []
        self.events: list[ScaleEvent] = []
        self.last_action = -math.inf
        self.finished: deque[tuple[float, float, float]] = deque()  # (finish, ttft, tpot or nan)

    def _new_lifetime(self, now: float, ready: float) -> int:
        index = len(self.lifetimes)
        self.lifetimes.append(Lifetime(index, now, ready))
        return index

    def _record_finished(self, finished: Iterable[Request]) -> None:
        for r in finished:
            if (entry := finished_latencies(r)) is not None:
                self.finished.append(entry)

    def _window(self, now: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """TTFTs and TPOTs of the requests finished within window_s before now."""
        while self.finished and self.finished[0][0] < now - self.scaling.window_s:
            self.finished.popleft()
        return tuple(f[1] for f in self.finished), tuple(f[2] for f in self.finished if f[2] == f[2])

    def _change(self, signal: FleetSignal) -> int:
        assert self.policy is not None
        return scale_by(self.policy.desired(signal), len(self.serving) + len(self.starting),
                        signal.now - self.last_action, self.scaling)

    def _acted(self, event: ScaleEvent) -> None:
        self.events.append(event)
        self.last_action = event.time_s

    def _remove(self, now: float, count: int, outstanding: Callable[[int], int]) -> list[int]:
        """Cancel the newest starting replicas first, then drain the serving ones holding the fewest
        requests (outstanding(index); ties: the newest)."""
        removed = []
        for _ in range(count):
            if self.starting:
                index = self.starting.pop()
                life = self.lifetimes[index]
                life.drain_s = life.stop_s = now
                life.cancelled = True
            else:
                index = min(reversed(self.serving), key=outstanding)
                self.serving.remove(index)
                self.draining.append(index)
                self.lifetimes[index].drain_s = now
            removed.append(index)
        return removed


class _Elastic(FleetStates):
    def __init__(self, make_replica: Callable[[int], Replica], initial: int, scaling: Scaling,
                 policy: ScalingPolicy | None, on_step: FleetStepHook | None) -> None:
        super().__init__(scaling, policy)
        self.make_replica = make_replica
        self.on_step = on_step
        self.replicas: list[Replica] = []
        for _ in range(initial):
            self.serving.append(self._add(0.0, 0.0))

    def _add(self, now: float, ready: float) -> int:
        index = self._new_lifetime(now, ready)
        replica = self.make_replica(index)
        replica.on_step = self._step
        self.replicas.append(replica)
        return index

    def _step(self, index: int, record: StepRecord | StepRun, finished: list[Request]) -> None:
        self._record_finished(finished)
        if self.on_step is not None:
            self.on_step(index, record, finished)

    def advance(self, t: float) -> None:
        """Run serving and draining replicas up to t; drained ones stop when their work ends."""
        for index in self.serving:
            _run_until(self.replicas[index], t)
        for index in list(self.draining):
            replica = self.replicas[index]
            _run_until(replica, t)
            if replica.next_event_time() == math.inf:
                life = self.lifetimes[index]
                life.stop_s = max(life.drain_s or 0.0, replica.clock.now())
                self.draining.remove(index)

    def next_ready(self) -> float:
        return min((self.lifetimes[i].ready_s for i in self.starting), default=math.inf)

    def promote(self, now: float) -> None:
        for index in [i for i in self.starting if self.lifetimes[i].ready_s <= now]:
            self.starting.remove(index)
            self.replicas[index].clock.wait_until(self.lifetimes[index].ready_s)
            self.serving.append(index)

    def signal(self, now: float) -> FleetSignal:
        ttfts, tpots = self._window(now)
        loads, ages = [], []
        for index in self.serving + self.draining:
            replica = self.replicas[index]
            scheduler = replica.scheduler
            ages += [now - r.arrival_time for r in scheduler.requests.values() if r.first_token_time is None]
            ages += [now - r.arrival_time for r in replica.inbox]
            if index in self.serving:
                blocks = scheduler.block_manager
                loads.append(ReplicaSignal(scheduler.num_running, scheduler.num_waiting + len(replica.inbox),
                                           1.0 - blocks.num_free_blocks / blocks.num_blocks))
        return FleetSignal(now, tuple(loads), len(self.starting), len(self.draining), ttfts, tpots, tuple(ages))

    def evaluate(self, now: float) -> None:
        change = self._change(self.signal(now))
        if change > 0:
            ready = now + self.scaling.cold_start.total_s
            started = [self._add(now, ready) for _ in range(change)]
            self.starting += started
            self._acted(ScaleEvent(now, "up", tuple(started)))
        elif change < 0:
            removed = self._remove(now, -change, lambda i: self.replicas[i].outstanding_requests())
            self._acted(ScaleEvent(now, "down", tuple(removed)))


def run_elastic(make_replica: Callable[[int], Replica], initial: int, requests: Iterable[Request], router: Router,
                scaling: Scaling, policy: ScalingPolicy | None, on_step: FleetStepHook | None = None) -> ElasticResult:
    """Serve requests to completion on a fleet of `initial` ready replicas (make_replica(i) builds
    replica i with a fresh clock at 0) that `policy` scales between scaling's bounds; policy None:
    a static fleet. The router sees the serving replicas only, in the order they became ready."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    fleet = _Elastic(make_replica, initial, scaling, policy, on_step)
    assignment: dict[str, int] = {}
    next_tick = scaling.interval_s if policy is not None else math.inf
    position = 0
    while position < len(pending):
        arrival = pending[position].arrival_time
        t = min(arrival, next_tick, fleet.next_ready())
        fleet.advance(t)
        fleet.promote(t)
        if next_tick <= t:
            fleet.evaluate(t)
            next_tick += scaling.interval_s
        if arrival <= t:
            request = pending[position]
            if not fleet.serving:
                raise RuntimeError(f"no replica serves at t={t:.3f} s (min_replicas must be >= 1)")
            choice = _route(request, [fleet.replicas[i] for i in fleet.serving], router, assignment)
            assignment[request.request_id] = fleet.serving[choice]
            fleet.replicas[fleet.serving[choice]].inbox.append(request)
            position += 1
    fleet.advance(math.inf)
    for replica in fleet.replicas:
        replica.result.makespan_s = replica.clock.now()
    result = _in_submission_order([r.result for r in fleet.replicas], pending, assignment)
    return closed(result, pending, fleet.lifetimes, fleet.events)


def closed(result: FleetResult, pending: list[Request], lifetimes: list[Lifetime],
           events: list[ScaleEvent]) -> ElasticResult:
    """An elastic run's result: it ends at its last finish or arrival, and every replica still
    serving (or starting) then is billed until then."""
    end = max(result.makespan_s, pending[-1].arrival_time if pending else 0.0)
    for life in lifetimes:
        if life.stop_s is None:
            life.stop_s = max(end, life.requested_s)
    result.makespan_s = end
    return ElasticResult(result, lifetimes, events)
