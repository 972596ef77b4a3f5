"""A fleet: N replicas (each its own Scheduler, executor and clock) behind one router.

Simulated fleets (run_fleet) run on one global event clock: each replica's clock only moves
forward. An arrival is routed once every replica's next iteration starts at or after it, so the
router sees each replica as it is at that moment: its planned steps booked, its later ones not
yet made.
A replica is engine.core.loop.Replica, the same loop body a single run drives, so a fleet of one
replays a single run exactly.

Engine fleets (run_fleet_wall) are data parallelism as vLLM serves it: each replica runs that
same loop body in its own process (engine.core.remote_replica.serve_replica, with overlapped steps
where its executor overlaps them), and this process only routes arrivals on the wall clock,
sends them on, and collects each replica's reports. engine.core.routers says what a router sees
of each kind of replica.

Each replica's executor is asked about itself once, through the seam (Executor.info()).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from engine.core.loop import Clock, FleetStepHook, Replica, RunResult, StepLog
from engine.core.remote_replica import ReplicaView, Report, keep_launches
from engine.core.request import Request
from engine.core.routers import ReplicaLoad, Router

# A wait on connections rounds its timeout up to the millisecond (selectors): wake this early,
# then sleep to the arrival, so a request is sent when it arrives rather than up to 1 ms later.
WAKE_EARLY_S = 1e-3


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
    # Replicas only interact through the router, so between two arrivals each one runs on its own:
    # every iteration starting before the next arrival is run, one replica after the other, then
    # the arrival is routed (the global clock's order, without comparing clocks on every step).
    for request in pending:
        for replica in replicas:
            _run_until(replica, request.arrival_time)
        replicas[_route(request, replicas, router, assignment)].inbox.append(request)
    for replica in replicas:
        _run_until(replica, math.inf)
    for replica in replicas:
        replica.result.makespan_s = replica.clock.now()
    return _in_submission_order([replica.result for replica in replicas], pending, assignment)


def _run_until(replica: Replica, t: float) -> None:
    """Run the replica's iterations that start before t."""
    replica.stop_at = t
    while replica.next_event_time() < t:
        replica.tick()


class ReplicaLinks(Protocol):
    """The router's connections to replicas that run their own loops (engine.replicas: one
    process each, answering engine.core.remote_replica's messages)."""

    def __len__(self) -> int: ...

    def send(self, index: int, kind: str, payload: object) -> None:
        """Queue a message for replica index; returns without waiting for the replica to read it."""

    def receive(self, timeout: float | None) -> list[tuple[int, str, object]]:
        """(replica index, kind, payload) of the messages that arrive within timeout seconds (None:
        until one does), in order per replica; raises a one-line error when a replica failed."""


def run_fleet_wall(links: ReplicaLinks, requests: Iterable[Request], router: Router, clock: Clock,
                   on_step: FleetStepHook | None = None) -> FleetResult:
    """Route requests on the wall clock to replicas that run their own loops, collecting their
    reports, to completion. The replicas' clocks share clock's origin (the caller passed it on).

    Each arrival is routed when the clock reaches it, by what the router sees of each replica
    (ReplicaView: a proxy's view); arrivals due together go to a replica in one message."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    views = [ReplicaView() for _ in range(len(links))]
    results = [RunResult(requests=[], steps=StepLog()) for _ in range(len(links))]
    assignment: dict[str, int] = {}
    done: set[int] = set()
    next_arrival, ended = 0, False
    while len(done) < len(links):
        next_arrival = _dispatch_due(pending, next_arrival, clock.now(), router, views, links, assignment)
        if next_arrival == len(pending) and not ended:
            for index in range(len(links)):
                links.send(index, "end", None)
            ended = True
        timeout = receive_timeout(pending, next_arrival, clock)
        if timeout == 0.0:
            continue  # slept to the next arrival: dispatch it now
        for index, kind, payload in links.receive(timeout):
            if kind == "report":
                _collect(index, cast(Report, payload), views[index], results[index], on_step)
            elif kind == "done":
                done.add(index)
                results[index].makespan_s = cast(float, payload)
            else:
                raise RuntimeError(f"replica {index}: unexpected message {kind!r}")
    return _in_submission_order(results, pending, assignment)


def receive_timeout(pending: Sequence[Request], next_arrival: int, clock: Clock) -> float | None:
    """How long the router may wait for replica messages: until WAKE_EARLY_S before the next
    arrival, or None (no arrival left: until a message comes). An arrival due sooner than that is
    slept to instead, and 0.0 says so: the caller dispatches it before reading messages."""
    return timeout_until(pending[next_arrival].arrival_time if next_arrival < len(pending) else math.inf, clock)


def timeout_until(due: float, clock: Clock) -> float | None:
    """receive_timeout's rule for any moment due (inf: none, None is returned)."""
    if due == math.inf:
        return None
    timeout = due - clock.now()
    if timeout <= WAKE_EARLY_S:
        clock.wait_until(due)
        return 0.0
    return timeout - WAKE_EARLY_S


def _dispatch_due(pending: list[Request], next_arrival: int, now: float, router: Router,
                  views: list[ReplicaView], links: ReplicaLinks, assignment: dict[str, int]) -> int:
    """Route the arrivals due by now and send each replica its share; returns the next arrival."""
    batches: dict[int, list[Request]] = {}
    while next_arrival < len(pending) and pending[next_arrival].arrival_time <= now:
        request = pending[next_arrival]
        index = _route(request, views, router, assignment)
        views[index].dispatched(request)
        batches.setdefault(index, []).append(request)
        next_arrival += 1
    for index, batch in batches.items():
        links.send(index, "requests", batch)
    return next_arrival


def _collect(index: int, report: Report, view: ReplicaView, result: RunResult,
             on_step: FleetStepHook | None) -> None:
    view.reported(report)
    result.steps.extend(report.steps)
    result.requests.extend(report.finished)
    result.rejected.update(report.rejected)
    keep_launches(report, result)
    if on_step is not None:
        for i, record in enumerate(report.steps, start=1):
            on_step(index, record, report.finished if i == len(report.steps) else [])


def _route(request: Request, replicas: Sequence[ReplicaLoad], router: Router, assignment: dict[str, int]) -> int:
    index = router.route(request, replicas)
    if not 0 <= index < len(replicas):
        raise RuntimeError(f"router {type(router).__name__} chose replica {index} of {len(replicas)}")
    assignment[request.request_id] = index
    return index


def _in_submission_order(results: list[RunResult], pending: list[Request], assignment: dict[str, int]) -> FleetResult:
    order = {r.request_id: i for i, r in enumerate(pending)}
    for result in results:
        result.requests.sort(key=lambda r: order[r.request_id])
    return FleetResult(results, assignment, max((r.makespan_s for r in results), default=0.0))
