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

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable

from engine.core.elastic_limits import ReplicaLimits, at_limit, budget_bound
from engine.core.elastic_states import (
    ColdStart,
    Demanded,
    ElasticResult,
    FleetStates,
    Lifetime,
    ScaleEvent,
    Scaling,
    SimulatedStates,
    finished_latencies,
    scale_by,
)
from engine.core.fleet import FleetResult, _in_submission_order, _route, _run_until
from engine.core.fleet_signal import FleetSignal, ReplicaSignal, ScalingPolicy, Served
from engine.core.loop import FleetStepHook, Replica, StepRecord, StepRun
from engine.core.request import Request
from engine.core.routers import Router

# the shared types, importable from here as before
__all__ = ["ColdStart", "Demanded", "ElasticResult", "FleetSignal", "FleetStates", "Lifetime", "ReplicaLimits",
           "ReplicaSignal", "ScaleEvent", "Served",
           "Scaling", "ScalingPolicy", "closed", "finished_latencies", "run_elastic", "scale_by"]


class _Elastic(SimulatedStates):
    def __init__(self, make_replica: Callable[[int], Replica], initial: int, scaling: Scaling,
                 policy: ScalingPolicy | None, on_step: FleetStepHook | None) -> None:
        super().__init__(scaling, policy)
        self.make_replica = make_replica
        self.on_step = on_step
        self.routes: deque[tuple[float, int]] = deque()  # (time, replica) of the requests routed, within the window
        # (time, replica, prompt tokens, output tokens) of the requests finished within one interval
        self.finishes: deque[tuple[float, int, int, int]] = deque()
        self.full: set[int] = set()  # the serving replicas full (at their admission limit) at the latest evaluation
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
        if self.policy is not None:
            self.finishes.extend((r.finish_time, index, r.num_prompt_tokens, r.num_output_tokens)
                                 for r in finished if r.finish_time is not None)
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

    def routed(self, time_s: float, index: int) -> None:
        """A request was routed to replica `index` (for the arrival rate each replica takes)."""
        while self.routes and self.routes[0][0] <= time_s - self.scaling.window_s:
            self.routes.popleft()
        self.routes.append((time_s, index))

    def _routed_rates(self, now: float, rate: float | None) -> dict[int, float | None]:
        """Each serving replica's share of the fleet's arrival rate (`rate`): its fraction of the
        requests routed since the serving set last changed (a replica began to serve or drained),
        within the window. A fraction is steadier than a count: a count of the 15 s between two
        evaluations at 2 req/s is +-18% (Poisson), as large as the margin between what a replica is
        sent and what it serves; a router's split is not (round robin's exactly 1/n)."""
        changed = max([life.ready_s for life in self.lifetimes if life.index in self.serving]
                      + [life.drain_s for life in self.lifetimes if life.drain_s is not None and not life.cancelled],
                      default=0.0)
        since = max(now - self.scaling.window_s, changed)  # within the window, as routed() keeps it
        counts = dict.fromkeys(self.serving, 0)
        for t, index in self.routes:
            if since < t <= now and index in counts:
                counts[index] += 1
        total = sum(counts.values())
        if rate is None or total == 0:
            return dict.fromkeys(self.serving, None)
        return {index: rate * count / total for index, count in counts.items()}

    def _served_full(self, now: float, full: set[int]) -> dict[int, Served]:
        """What each replica full at the previous evaluation and now finished since then
        (ReplicaSignal.served_full); the finishes before that interval are dropped."""
        since = now - self.scaling.interval_s
        while self.finishes and self.finishes[0][0] <= since:
            self.finishes.popleft()
        both = full & self.full
        done: dict[int, list[tuple[int, int]]] = {index: [] for index in both}
        for t, index, prompt, output in self.finishes:
            if index in both and t <= now:
                done[index].append((prompt, output))
        return {index: Served(len(lengths) / self.scaling.interval_s,
                              sum(p for p, _ in lengths) / len(lengths), sum(o for _, o in lengths) / len(lengths))
                for index, lengths in done.items() if lengths}

    def signal(self, now: float) -> FleetSignal:
        ttfts, tpots = self._window(now)
        loads, ages = [], []
        for index in self.serving + self.draining:
            replica = self.replicas[index]
            waiting, waited = self.waiting_signal(replica, now)
            ages += waited
            if index in self.serving:
                scheduler, blocks = replica.scheduler, replica.scheduler.block_manager
                loads.append(ReplicaSignal(scheduler.num_running, waiting,
                                           1.0 - blocks.num_free_blocks / blocks.num_blocks,
                                           scheduler.num_waiting + len(replica.inbox), at_limit(replica),
                                           budget_bound(replica)))
        queued = any(load.full or load.budget_bound for load in loads)
        demand = self._demand(now, queued)
        rates = self._routed_rates(now, demand.arrival_rate)
        full = {i for i, load in zip(self.serving, loads) if load.full}
        served, self.full = self._served_full(now, full), full
        loads = [dataclasses.replace(load, arrival_rate=rates[i], served_full=served.get(i))
                 for i, load in zip(self.serving, loads)]
        return FleetSignal(now, tuple(loads), len(self.starting), len(self.draining), ttfts, tpots, tuple(ages),
                           demand.arrival_rate, demand.service_s, self.scaling.cold_start.total_s,
                           demand.prompt_tokens, demand.output_tokens, self.scaling.limits,
                           self.scaling.interval_s, self.evidence_s(now), self.scaling.settle,
                           self.scaling.scale_up_cooldown_s)

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
            fleet.arrived(request.arrival_time, request.num_prompt_tokens)
            if not fleet.serving:
                raise RuntimeError(f"no replica serves at t={t:.3f} s (min_replicas must be >= 1)")
            choice = _route(request, [fleet.replicas[i] for i in fleet.serving], router, assignment)
            assignment[request.request_id] = fleet.serving[choice]
            fleet.routed(request.arrival_time, fleet.serving[choice])
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
