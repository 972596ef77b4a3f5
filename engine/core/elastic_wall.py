"""An elastic fleet of replicas that run their own loops (engine replica processes), on the wall
clock: engine.core.fleet.run_fleet_wall with replicas that start, serve, drain and stop as a
policy asks, kept and decided by engine.core.elastic's FleetStates, so the rules (bounds,
cooldowns, which replica a scale-down takes) are the simulated fleet's.

A replica started mid-run is a new process (ElasticLinks.launch): it says ("hello", None) once
its interpreter and imports are up, then ("ready", BackendInfo) once it has loaded the weights,
sized its KV cache and captured its graphs. Only then does the router send it ("run", origin)
and route arrivals to it, so its lifetime's ready_s is the moment it can take traffic. A replica
drained gets "end" at once: it finishes what it holds and says "done", its stop.

What a policy sees here is what the router knows, since no replica reports its queue or KV use:
each serving replica's outstanding requests as running, none waiting, KV use NaN, the window's
TTFTs and TPOTs of finished requests, and no waiting ages. The harness lets only the schedule
policy (which reads the time alone) drive an engine fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol, cast

from engine.core.elastic import closed
from engine.core.elastic_states import ElasticResult, FleetStates, ScaleEvent, Scaling
from engine.core.fleet import ReplicaLinks, _collect, _in_submission_order, _route, timeout_until
from engine.core.fleet_signal import FleetSignal, ReplicaSignal, ScalingPolicy
from engine.core.loop import FleetStepHook, RunResult, StepLog, WallClock
from engine.core.remote_replica import ReplicaView, Report
from engine.core.request import Request
from engine.core.routers import Router


class ElasticLinks(ReplicaLinks, Protocol):
    def launch(self) -> int:
        """Start one more replica (its process, which then loads); returns its index, len(self)
        before the call. Its "hello" and "ready" come through receive()."""


class _WallElastic(FleetStates):
    def __init__(self, links: ElasticLinks, initial: int, clock: WallClock, scaling: Scaling,
                 policy: ScalingPolicy | None, on_step: FleetStepHook | None) -> None:
        super().__init__(scaling, policy)
        self.links = links
        self.clock = clock
        self.on_step = on_step
        self.views: list[ReplicaView] = []
        self.results: list[RunResult] = []
        self.done: set[int] = set()
        for _ in range(initial):
            index = self._track(0.0, 0.0)
            self.serving.append(index)
            links.send(index, "run", clock.origin)

    def _track(self, now: float, ready: float) -> int:
        self.views.append(ReplicaView())
        self.results.append(RunResult(requests=[], steps=StepLog()))
        return self._new_lifetime(now, ready)

    def signal(self, now: float) -> FleetSignal:
        ttfts, tpots = self._window(now)
        loads = tuple(ReplicaSignal(self.views[i].outstanding_requests(), 0, math.nan) for i in self.serving)
        return FleetSignal(now, loads, len(self.starting), len(self.draining), ttfts, tpots, ())

    def evaluate(self, now: float) -> None:
        change = self._change(self.signal(now))
        if change > 0:
            started = []
            for _ in range(change):
                index = self._track(now, math.inf)  # ready_s: when it says so
                launched = self.links.launch()
                assert launched == index, f"links launched replica {launched}, the fleet expected {index}"
                started.append(index)
            self.starting += started
            self._acted(ScaleEvent(now, "up", tuple(started)))
        elif change < 0:
            removed = self._remove(now, -change, lambda i: self.views[i].outstanding_requests())
            for index in removed:
                if index in self.draining:
                    self.links.send(index, "end", None)
            self._acted(ScaleEvent(now, "down", tuple(removed)))

    def dispatch(self, pending: list[Request], next_arrival: int, now: float, router: Router,
                 assignment: dict[str, int]) -> int:
        """Route the arrivals due by now among the serving replicas and send each its share."""
        batches: dict[int, list[Request]] = {}
        while next_arrival < len(pending) and pending[next_arrival].arrival_time <= now:
            request = pending[next_arrival]
            if not self.serving:
                raise RuntimeError(f"no replica serves at t={now:.3f} s (min_replicas must be >= 1)")
            index = self.serving[_route(request, [self.views[i] for i in self.serving], router, assignment)]
            assignment[request.request_id] = index
            self.views[index].dispatched(request)
            batches.setdefault(index, []).append(request)
            next_arrival += 1
        for index, batch in batches.items():
            self.links.send(index, "requests", batch)
        return next_arrival

    def end(self) -> None:
        for index in self.serving:
            self.links.send(index, "end", None)

    def handle(self, index: int, kind: str, payload: object, ended: bool) -> None:
        if kind == "report":
            report = cast(Report, payload)
            self._record_finished(report.finished)
            _collect(index, report, self.views[index], self.results[index], self.on_step)
        elif kind == "ready":
            # a replica ready after the last arrival (or cancelled while starting) never serves
            if index in self.starting and not ended:
                self.starting.remove(index)
                self.lifetimes[index].ready_s = self.clock.now()
                self._became_ready(self.clock.now())
                self.links.send(index, "run", self.clock.origin)
                self.serving.append(index)
        elif kind == "done":
            self.done.add(index)
            makespan = cast(float, payload)
            self.results[index].makespan_s = makespan
            if index in self.draining:
                self.draining.remove(index)
                life = self.lifetimes[index]
                life.stop_s = max(life.drain_s or 0.0, makespan)
        elif kind != "hello":  # hello: the process is up and loads next
            raise RuntimeError(f"replica {index}: unexpected message {kind!r}")

    def finished_all(self) -> bool:
        return not self.draining and all(i in self.done for i in self.serving)


def run_elastic_wall(links: ElasticLinks, initial: int, requests: Iterable[Request], router: Router,
                     clock: WallClock, scaling: Scaling, policy: ScalingPolicy | None,
                     on_step: FleetStepHook | None = None) -> ElasticResult:
    """Serve requests to completion on links' first `initial` replicas, loaded and waiting for
    "run" (sent here, with clock's origin), which `policy` scales between scaling's bounds by
    launching more (links.launch) and draining some; policy None: a static fleet. Policy
    evaluations fall on the wall clock every interval_s while arrivals remain, as in run_elastic."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    fleet = _WallElastic(links, initial, clock, scaling, policy, on_step)
    assignment: dict[str, int] = {}
    next_arrival, ended = 0, False
    next_tick = scaling.interval_s if policy is not None else math.inf
    while not (ended and fleet.finished_all()):
        now = clock.now()
        if not ended and next_tick <= now:
            fleet.evaluate(now)
            next_tick += scaling.interval_s
        next_arrival = fleet.dispatch(pending, next_arrival, now, router, assignment)
        if next_arrival == len(pending) and not ended:
            fleet.end()
            ended = True
            continue
        due = math.inf if ended else min(pending[next_arrival].arrival_time, next_tick)
        timeout = timeout_until(due, clock)
        if timeout == 0.0:
            continue  # slept to the next arrival or evaluation: do it now
        for index, kind, payload in links.receive(timeout):
            fleet.handle(index, kind, payload, ended)
    return closed(_in_submission_order(fleet.results, pending, assignment), pending, fleet.lifetimes, fleet.events)
