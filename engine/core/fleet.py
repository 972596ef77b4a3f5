"""A fleet: N replicas (each its own Scheduler, executor and clock) behind one router.

Simulated fleets (run_fleet) run on one global event clock: each replica's clock only moves
forward, and the loop always advances the replica whose next iteration starts earliest. An
arrival is routed once every replica's next iteration starts at or after it, so the router sees
each replica as it is at that moment: its planned steps booked, its later ones not yet made.
A replica is engine.core.loop.Replica, the same loop body a single run drives, so a fleet of one
replays a single run exactly.

Engine fleets (run_fleet_wall) share the wall clock: every idle replica with work gets its next
step submitted before the loop waits on any, so replicas in other processes compute at once.

Each replica's executor is asked about itself once, through the seam (Executor.info()).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from engine.core.executor import PendingStep
from engine.core.loop import Clock, FleetStepHook, Replica, RunResult
from engine.core.request import Request
from engine.core.routers import Router

@dataclass
class FleetResult:
    replicas: list[RunResult]  # per replica, requests in submission order
    assignment: dict[str, int] = field(default_factory=dict)  # request id -> replica index
    makespan_s: float = 0.0


def run_fleet(replicas: Sequence[Replica], requests: Iterable[Request], router: Router,
              on_step: FleetStepHook | None = None) -> FleetResult:
    """Serve requests on simulated replicas (each its own clock, all starting at 0) to completion."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    assignment: dict[str, int] = {}
    for replica in replicas:
        replica.on_step = on_step
    next_arrival = 0
    while True:
        times = [replica.next_event_time() for replica in replicas]
        earliest = min(range(len(replicas)), key=times.__getitem__)
        if next_arrival < len(pending) and pending[next_arrival].arrival_time <= times[earliest]:
            _route(pending[next_arrival], replicas, router, assignment)
            next_arrival += 1
        elif math.isinf(times[earliest]):
            break
        else:
            replicas[earliest].tick()
    return _finish(replicas, pending, assignment)


def run_fleet_wall(replicas: Sequence[Replica], requests: Iterable[Request], router: Router, clock: Clock,
                   wait_any: Callable[[list[PendingStep], float | None], list[int]],
                   on_step: FleetStepHook | None = None) -> FleetResult:
    """Serve requests on replicas that compute concurrently (engine processes) against one wall
    clock. Each replica runs its steps one at a time (plan, compute, update); wait_any(pending,
    timeout) returns the indices of the pending steps that are done (none on timeout)."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    assignment: dict[str, int] = {}
    for replica in replicas:
        replica.on_step = on_step
    next_arrival = 0
    while next_arrival < len(pending) or any(r.next_event_time() < math.inf for r in replicas):
        now = clock.now()
        while next_arrival < len(pending) and pending[next_arrival].arrival_time <= now:
            _route(pending[next_arrival], replicas, router, assignment)
            next_arrival += 1
        for replica in replicas:
            if replica.in_flight is None:
                _submit(replica, now)
        busy = [r for r in replicas if r.in_flight is not None]
        until_arrival = pending[next_arrival].arrival_time - now if next_arrival < len(pending) else None
        if not busy:
            if until_arrival is not None:
                clock.wait_until(pending[next_arrival].arrival_time)
            continue
        for i in wait_any([r.in_flight[1] for r in busy], until_arrival):
            busy[i].finish_in_flight()
    return _finish(replicas, pending, assignment)


def _submit(replica: Replica, now: float) -> None:
    replica.admit(now)
    if not replica.scheduler.has_unfinished():
        return
    plan = replica.scheduler.schedule(now)
    if plan.is_empty:
        raise RuntimeError(f"replica {replica.index}: scheduler produced an empty step with "
                           f"{replica.scheduler.num_waiting} waiting and {replica.scheduler.num_running} running")
    replica.in_flight = (plan, replica.executor.submit(plan), now)


def _route(request: Request, replicas: Sequence[Replica], router: Router, assignment: dict[str, int]) -> None:
    index = router.route(request, replicas)
    if not 0 <= index < len(replicas):
        raise RuntimeError(f"router {type(router).__name__} chose replica {index} of {len(replicas)}")
    assignment[request.request_id] = index
    replicas[index].inbox.append(request)


def _finish(replicas: Sequence[Replica], pending: list[Request], assignment: dict[str, int]) -> FleetResult:
    order = {r.request_id: i for i, r in enumerate(pending)}
    for replica in replicas:
        replica.result.requests.sort(key=lambda r: order[r.request_id])
        replica.result.makespan_s = replica.clock.now()
    results = [replica.result for replica in replicas]
    return FleetResult(results, assignment, max((r.makespan_s for r in results), default=0.0))
