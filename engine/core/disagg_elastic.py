"""A disaggregated fleet whose prefill and decode pools each scale on their own: engine.core.disagg_fleet's
event loop, with each pool's replicas starting, serving, draining and stopping as its own policy asks
(engine.core.elastic_states' SimulatedStates per pool: its bounds, cooldowns, evaluation interval, cold start).

Arrivals go to serving prefill replicas only; transfers to serving decode replicas only (a draining
decode replica still receives the transfers already under way to it). A draining prefill replica stops
once it has nothing to compute and holds no KV for a transfer; a draining decode replica once it has
nothing to decode and nothing in transit. What each pool's policy sees: its serving replicas' running
and waiting requests and KV use; the prefill pool the TTFTs of the window's first tokens and the ages
of requests still waiting for theirs; the decode pool the window's finished requests' TTFTs and TPOTs,
and as waiting, the requests blocked for want of a decode replica, spread over its serving replicas.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.core.disagg import DecodeReplica, PrefillReplica, prefill_copy
from engine.core.disagg_events import FleetEvents, fleet_result
from engine.core.disagg_fleet import run_stop
from engine.core.disagg_types import DisaggResult, Transfer, TransferPricer
from engine.core.elastic_limits import at_limit, budget_bound
from engine.core.elastic_states import Finished, Lifetime, ScaleEvent, Scaling, SimulatedStates, finished_latencies
from engine.core.fleet_signal import FleetSignal, ReplicaSignal, ScalingPolicy
from engine.core.loop import FleetStepHook, Replica, StepRecord, StepRun
from engine.core.request import Request
from engine.core.routers import Router

POOLS = ("prefill", "decode")


@dataclass
class PoolHistory:
    lifetimes: list[Lifetime]
    events: list[ScaleEvent] = field(default_factory=list)


@dataclass
class ElasticDisaggResult:
    fleet: DisaggResult
    prefill: PoolHistory
    decode: PoolHistory


class _Pool(SimulatedStates):
    def __init__(self, make: Callable[[int], Replica], scaling: Scaling, policy: ScalingPolicy | None) -> None:
        super().__init__(scaling, policy)
        self.make = make
        self.next_tick = scaling.interval_s if policy is not None else math.inf

    def add(self, now: float, ready: float) -> Replica:
        index = self._new_lifetime(now, ready)
        replica = self.make(index)
        self.replicas.append(replica)
        return replica

    def active(self) -> list[Replica]:
        return [self.replicas[i] for i in self.serving + self.draining]

    def stop_idle(self, idle: Callable[[Replica], bool]) -> None:
        for index in [i for i in self.draining if idle(self.replicas[i])]:
            life = self.lifetimes[index]
            life.stop_s = max(life.drain_s or 0.0, self.replicas[index].clock.now())
            self.draining.remove(index)

    def signal(self, now: float, extra_waiting: int, ages: tuple[float, ...]) -> FleetSignal:
        """What the pool's policy sees; `extra_waiting` requests blocked for want of one of its
        replicas count as waiting, spread over the serving ones, which they show to be full."""
        ttfts, tpots = self._window(now)
        loads = []
        for k, index in enumerate(self.serving):
            replica = self.replicas[index]
            scheduler, blocks = replica.scheduler, replica.scheduler.block_manager
            spread = extra_waiting // len(self.serving) + (k < extra_waiting % len(self.serving))
            waiting = self.waiting_signal(replica, now)[0] + spread
            used = 1.0 - blocks.num_free_blocks / blocks.num_blocks
            loads.append(ReplicaSignal(scheduler.num_running, waiting, used, None,
                                       extra_waiting > 0 or at_limit(replica), budget_bound(replica)))
        demand = self._demand(now, any(load.full or load.budget_bound for load in loads))
        return FleetSignal(now, tuple(loads), len(self.starting), len(self.draining), ttfts, tpots, ages,
                           demand.arrival_rate, demand.service_s, self.scaling.cold_start.total_s,
                           demand.prompt_tokens, demand.output_tokens, self.scaling.limits,
                           self.scaling.interval_s, self.evidence_s(now), self.scaling.settle,
                           self.scaling.scale_up_cooldown_s)

    def evaluate(self, now: float, signal: FleetSignal, hook: Callable[[Replica], None]) -> None:
        change = self._change(signal)
        if change > 0:
            started = [self.add(now, now + self.scaling.cold_start.total_s) for _ in range(change)]
            for replica in started:
                hook(replica)
            self.starting += [r.index for r in started]
            self._acted(ScaleEvent(now, "up", tuple(r.index for r in started)))
        elif change < 0:
            removed = self._remove(now, -change, lambda i: self.replicas[i].outstanding_requests())
            self._acted(ScaleEvent(now, "down", tuple(removed)))


class _ElasticFleet(FleetEvents):
    """disagg_events's event handling over pools that change: transfers go to serving decode replicas."""

    def __init__(self, pools: tuple[_Pool, _Pool], decode_router: Router, pricer: TransferPricer,
                 on_step: FleetStepHook | None, queue_behind_step: bool = False) -> None:
        self.pools = pools
        prefill = [r for r in pools[0].replicas if isinstance(r, PrefillReplica)]
        decode = [r for r in pools[1].replicas if isinstance(r, DecodeReplica)]
        super().__init__(prefill, decode, decode_router, pricer, on_step, queue_behind_step=queue_behind_step)

    def hook(self, replica: Replica) -> None:
        """A replica a pool just made joins the fleet's lists and hooks."""
        if isinstance(replica, PrefillReplica):
            assert isinstance(self.prefill, list)
            self.prefill.append(replica)
            replica.on_step = self._prefill_step
        else:
            assert isinstance(replica, DecodeReplica) and isinstance(self.decode, list)
            self.decode.append(replica)
            replica.on_step = self._decode_step

    def _decode_open(self) -> list[DecodeReplica]:
        return [self.decode[i] for i in self.pools[1].serving]

    def _prefill_step(self, index: int, record: StepRecord | StepRun, finished: list[Request]) -> None:
        # the prefill pool's window: each first token, a request finished as far as its TTFT goes,
        # in service from its first step to its first token, with one output token
        for c in finished:
            if c.first_token_time is not None:
                began = c.first_scheduled_time
                service = c.first_token_time - began if began is not None else math.nan
                _in_order(self.pools[0].finished, (c.first_token_time, c.first_token_time - c.arrival_time, math.nan,
                                                   c.arrival_time, service, 1))
        super()._prefill_step(index, record, finished)

    def _decode_step(self, index: int, record: StepRecord | StepRun, finished: list[Request]) -> None:
        # the decode pool's window: its time in service from the transfer that reserved its blocks
        for r in finished:
            if (entry := finished_latencies(r)) is not None:
                start = self.transfers[r.request_id].start_s
                _in_order(self.pools[1].finished, (*entry[:4], entry[0] - start, entry[5]))
        super()._decode_step(index, record, finished)

    def _handoff(self, t: float, copy: Request) -> None:
        """A first token: the request arrives at the decode pool's demand, unless it ends there."""
        super()._handoff(t, copy)
        request = self.originals[copy.request_id]
        if not request.is_finished and copy.request_id not in self.rejected:
            self.pools[1].arrived(t, request.num_prompt_tokens)

    def waiting_ages(self, now: float) -> tuple[float, ...]:
        pool = self.pools[0]
        return tuple(age for replica in pool.active() for age in pool.waiting_signal(replica, now)[1])


def _in_order(window: deque[Finished], entry: Finished) -> None:
    """Put a finished request's (finish, TTFT, TPOT, arrival, time in service) in a pool's window in finish order
    (ties: arrival, TTFT, TPOT), whatever order the replicas report in: a run booked at once
    reports its finishes ahead of other replicas' earlier steps, and the window is pruned as a
    prefix (SimulatedStates._window) and read in order."""
    key = _window_key(entry)
    position = len(window)
    while position > 0 and _window_key(window[position - 1]) > key:
        position -= 1
    window.insert(position, entry)


def _window_key(entry: Finished) -> tuple[float, float, float, float]:
    finish, ttft, tpot, arrival = entry[:4]
    return finish, arrival, ttft, -1.0 if math.isnan(tpot) else tpot


def _prefill_idle(replica: Replica) -> bool:
    assert isinstance(replica, PrefillReplica)
    return replica.outstanding_requests() == 0 and replica.in_flight is None and not replica.holding.held


def _decode_idle(replica: Replica) -> bool:
    return replica.outstanding_requests() == 0 and replica.in_flight is None


def run_disaggregated_elastic(make: tuple[Callable[[int], PrefillReplica], Callable[[int], DecodeReplica]],
                              initial: tuple[int, int], requests: Iterable[Request], prefill_router: Router,
                              decode_router: Router, pricer: TransferPricer, scalings: tuple[Scaling, Scaling],
                              policies: tuple[ScalingPolicy | None, ScalingPolicy | None],
                              on_step: FleetStepHook | None = None,
                              queue_behind_step: bool = False) -> ElasticDisaggResult:
    """Serve requests to completion on initial[0] prefill and initial[1] decode replicas, ready at 0
    (make[p](i) builds pool p's replica i on a fresh clock), each pool scaled by its policy (None:
    that pool's size is fixed). Evaluations, as in run_elastic, fall while arrivals remain.
    queue_behind_step: engine.core.disagg_events's rule for when a send starts on the wire."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    pools = (_Pool(make[0], scalings[0], policies[0]), _Pool(make[1], scalings[1], policies[1]))
    for pool, count in zip(pools, initial):
        for _ in range(count):
            pool.serving.append(pool.add(0.0, 0.0).index)
    fleet = _ElasticFleet(pools, decode_router, pricer, on_step, queue_behind_step)
    idle = (_prefill_idle, _decode_idle)
    next_arrival = 0
    while True:
        for pool, check in zip(pools, idle):
            pool.stop_idle(check)
        t_arrival = pending[next_arrival].arrival_time if next_arrival < len(pending) else math.inf
        t_event = fleet.events[0][0] if fleet.events else math.inf
        t_tick = min(p.next_tick for p in pools) if t_arrival < math.inf else math.inf
        t_ready = min(p.next_ready() for p in pools)
        t = min(t_arrival, t_event, t_tick, t_ready)
        active = pools[0].active() + pools[1].active()
        first = min(active, key=lambda r: r.next_event_time(), default=None)  # a stalled prefill replica: inf
        if first is not None and first.next_event_time() < t:
            # a booked run stops before t (the next arrival, event, evaluation or replica ready)
            # and before any prefill replica's next step (its first tokens); none starts while
            # requests wait for a decode replica (any decode step's end may let one in)
            bounding = [isinstance(replica, PrefillReplica) for replica in active]
            first.stop_at = -math.inf if fleet.blocked else run_stop(first, active, bounding, t)
            first.tick()
            continue
        if t == math.inf:
            break
        if t_ready <= t:
            for pool in pools:
                pool.promote(t)
        elif t_tick <= t:
            _evaluate(fleet, t)
        elif t_event <= t_arrival:
            _, _, kind, request = heapq.heappop(fleet.events)
            fleet.handle(t, kind, request)
        else:
            request = pending[next_arrival]
            pools[0].arrived(t, request.num_prompt_tokens)
            _route_arrival(fleet, [fleet.prefill[i] for i in pools[0].serving], prefill_router, request, t)
            next_arrival += 1
    assert not fleet.blocked, "requests left waiting for a decode replica"
    return _result(fleet, pools, pending)


def _route_arrival(fleet: _ElasticFleet, serving: list[PrefillReplica], prefill_router: Router, request: Request,
                   t: float) -> None:
    """Hand an arriving request to the serving prefill replica the router picks."""
    if not serving:
        raise RuntimeError(f"no prefill replica serves at t={t:.3f} s (min_replicas must be >= 1)")
    choice = prefill_router.route(request, serving)
    if not 0 <= choice < len(serving):
        raise RuntimeError(f"prefill router chose replica {choice} of {len(serving)}")
    fleet.originals[request.request_id] = request
    fleet.transfers[request.request_id] = Transfer(serving[choice].index)
    serving[choice].inbox.append(prefill_copy(request))


def _result(fleet: _ElasticFleet, pools: tuple[_Pool, _Pool], pending: list[Request]) -> ElasticDisaggResult:
    """The finished run's result, each replica still serving (or starting) billed until its end."""
    fleet.replicas = [*fleet.prefill, *fleet.decode]
    result = fleet_result(fleet, pending)
    end = max(result.makespan_s, pending[-1].arrival_time if pending else 0.0)
    for pool in pools:
        for life in pool.lifetimes:
            if life.stop_s is None:
                life.stop_s = max(end, life.requested_s)
    result.makespan_s = end
    return ElasticDisaggResult(result, PoolHistory(pools[0].lifetimes, pools[0].events),
                               PoolHistory(pools[1].lifetimes, pools[1].events))


def _evaluate(fleet: _ElasticFleet, t: float) -> None:
    prefill, decode = fleet.pools
    if prefill.next_tick <= t:
        prefill.evaluate(t, prefill.signal(t, 0, fleet.waiting_ages(t)), fleet.hook)
        prefill.next_tick += prefill.scaling.interval_s
    if decode.next_tick <= t:
        decode.evaluate(t, decode.signal(t, len(fleet.blocked), ()), fleet.hook)
        decode.next_tick += decode.scaling.interval_s
