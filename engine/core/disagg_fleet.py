"""A disaggregated fleet on one event clock: P prefill replicas, D decode replicas, KV moved between
(engine.core.disagg_events says what happens at each event, and with handshake=True).

Events are handled in time order, and every replica has run each iteration that starts before an
event first (engine.core.fleet's rule for arrivals), so a router sees replicas as they are then.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

from engine.core.disagg import DecodeReplica, PrefillReplica, prefill_copy
from engine.core.disagg_events import FleetEvents, fleet_result
from engine.core.disagg_types import DisaggResult, Transfer, TransferPricer
from engine.core.loop import FleetStepHook, Replica
from engine.core.request import Request
from engine.core.routers import Router
from engine.core.transfer_receive import Sigma


def run_disaggregated(prefill: Sequence[PrefillReplica], decode: Sequence[DecodeReplica], requests: Iterable[Request],
                      prefill_router: Router, decode_router: Router, pricer: TransferPricer,
                      on_step: FleetStepHook | None = None, handshake: bool = False,
                      queue_behind_step: bool = False, recv_behind_step: bool = False,
                      landing_lag_s: float = 0.0, send_lag_s: float = 0.0, landing_lag_sigma: Sigma = 0.0,
                      send_lag_sigma: Sigma = 0.0) -> DisaggResult:
    """Serve requests to completion; replica indices in on_step: prefill first, then decode;
    handshake: the engine's protocol; queue_behind_step: sends wait for the prefill step in flight;
    recv_behind_step: receives for the decode step in flight; landing_lag_s: the decode loop's check for
    landed receives after a step; send_lag_s: the reserve's message to the prefill replica; the
    sigmas: each lag's spread (engine.core.transfer_receive; engine.core.disagg_events's docstring)."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    fleet = FleetEvents(prefill, decode, decode_router, pricer, on_step, handshake, queue_behind_step,
                        recv_behind_step, landing_lag_s, send_lag_s, landing_lag_sigma, send_lag_sigma)
    replicas = fleet.replicas
    next_arrival = 0
    while True:
        t_arrival = pending[next_arrival].arrival_time if next_arrival < len(pending) else math.inf
        t_event = fleet.events[0][0] if fleet.events else math.inf
        t = min(t_arrival, t_event)
        # the replica whose next iteration starts first runs it, if it starts before the next event
        first = min(replicas, key=_next_event_time)
        if first.next_event_time() < t:
            first.stop_at = _stop_at(fleet, first, t)
            first.tick()
            continue
        if t == math.inf:
            break
        if t_event <= t_arrival:
            _, _, kind, request = heapq.heappop(fleet.events)
            fleet.handle(t, kind, request)
            continue
        request = pending[next_arrival]
        next_arrival += 1
        fleet.originals[request.request_id] = request
        choice = prefill_router.route(request, prefill)
        if not 0 <= choice < len(prefill):
            raise RuntimeError(f"prefill router chose replica {choice} of {len(prefill)}")
        fleet.transfers[request.request_id] = Transfer(choice)
        prefill[choice].inbox.append(prefill_copy(request))
    assert not fleet.blocked, "requests left waiting for a decode replica"
    return fleet_result(fleet, pending)


def _next_event_time(replica: Replica) -> float:
    return replica.next_event_time()


def _stop_at(fleet: FleetEvents, first: Replica, t: float) -> float:
    """Where a run booked by fast-forward (engine.core.fast_forward) on `first` must stop
    (run_stop): the bounding replicas are the prefill replicas (their first tokens) and any whose
    step a handshake message waits on. None while requests wait for a decode replica (any step's
    end may let one in: RETRY), nor while a message waits for the end of the replica's step in
    flight (handshake): it comes at the first step's end, not a run's last."""
    index = fleet.replicas.index(first)
    after_step = fleet.after_step
    if fleet.blocked or index in after_step:
        return -math.inf
    bounding = [i < len(fleet.prefill) or i in after_step for i in range(len(fleet.replicas))]
    return run_stop(first, fleet.replicas, bounding, t)


def run_stop(first: Replica, order: Sequence[Replica], bounding: Sequence[bool], t: float) -> float:
    """Where a run booked on `first` must stop: no step of it starts at or past the fleet's next
    event t, nor past the next iteration of any other replica whose step may push an event that
    comes before the steps booked past it (bounding[i], order[i]). `order` is the list the
    step-by-step loop takes the replica with the earliest iteration from, the earlier on a tie."""
    index = next(i for i, replica in enumerate(order) if replica is first)
    stop = t
    for i, other in enumerate(order):
        if i != index and bounding[i]:
            start = other.next_event_time()
            # a later replica's iteration at the same time runs after first's
            stop = min(stop, start if i < index else math.nextafter(start, math.inf))
    return stop
