"""Autoscaling policies: each turns what the fleet sees (engine.core.elastic.FleetSignal) into a
desired replica count. Each registers its class in AUTOSCALE_POLICIES under the name
autoscale.policy takes; from_config builds one from the autoscale and slo sections."""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from engine.core.elastic import FleetSignal, ScalingPolicy
from engine.core.registry import Registry
from harness.autoscale.demand import Demand, MissSizing

if TYPE_CHECKING:  # the config module imports this one (to check autoscale.policy)
    from harness.autoscale.config import SLO, AutoscaleConfig


class RegisteredPolicy:
    # The autoscale settings this policy reads beyond those every policy reads (bounds, interval,
    # cooldowns, windows, start-up): AutoscaleConfig.check_read refuses another policy's set for
    # this one. READ_WHEN: those it reads only while another of its settings has a value.
    READS: ClassVar[tuple[str, ...]] = ()
    READ_WHEN: ClassVar[Mapping[str, tuple[str, str]]] = MappingProxyType({})

    @classmethod
    def reads(cls, config: AutoscaleConfig) -> tuple[str, ...]:
        """The settings of READS this policy reads with config's other settings."""
        return tuple(name for name in cls.READS
                     if name not in cls.READ_WHEN or getattr(config, cls.READ_WHEN[name][0]) == cls.READ_WHEN[name][1])

    @classmethod
    def from_config(cls, config: AutoscaleConfig, slo: SLO) -> ScalingPolicy:
        raise NotImplementedError

    def desired(self, signal: FleetSignal) -> int:
        raise NotImplementedError


AUTOSCALE_POLICIES: Registry[type[RegisteredPolicy]] = Registry("autoscale.policy")


def _current(signal: FleetSignal) -> int:
    return len(signal.serving) + signal.starting


def _bounded(signal: FleetSignal, want: int, demand: Demand) -> int:
    """A load policy's wish, as the demand bounds it (harness.autoscale.demand.Demand):

    - a scale-down leaves no fewer than serve the highest arrival rate read over the time a replica
      drained now takes to come back, at a full replica's measured capacity (Demand.floor);
    - with settling, while a replica starts, a scale-up only to what the arrival rate needs at a
      replica's capacity (Demand.by_rate): the latencies and queues a policy reads cannot show the
      capacity the pending start brings, but the rate can show a surge that needs more than it.
    """
    current = _current(signal)
    if want < current:
        return min(current, max(want, demand.floor(signal)))
    if want > current and signal.settle and signal.starting:
        return min(want, max(current, demand.by_rate(signal) or 0))
    return want


@AUTOSCALE_POLICIES.register("utilisation")
class Utilisation(RegisteredPolicy):
    """Kubernetes HPA's rule: ceil(serving x mean load / target). Load is KV use (metric=kv) or
    requests per replica (metric=running: Knative's concurrency), counted as the requests the
    arrival stream keeps in service (harness.autoscale.demand), not as those held: a backlog held
    on the serving replicas is no load a new replica can take; the time that backlog keeps them
    busy after the start-up comes on top, as they take no arrivals meanwhile; and no fewer than
    serve the arrival rate at a replica's capacity (a replica bound by its prompt tokens reaches it
    with fewer requests in service than the target). Until the demand is measured, the requests
    held, running or waiting. NOTE: KV use alone misses a queue that waits for a sequence slot
    rather than for blocks."""

    READS = ("metric", "target", "target_running", "settle")
    READ_WHEN = MappingProxyType({"target": ("metric", "kv"), "target_running": ("metric", "running")})

    @classmethod
    def from_config(cls, config: AutoscaleConfig, slo: SLO) -> ScalingPolicy:
        return cls(config.metric, config.target if config.metric == "kv" else config.target_running)

    def __init__(self, metric: str, target: float) -> None:
        self.metric = metric
        self.target = target
        self.demand = Demand()

    def desired(self, signal: FleetSignal) -> int:
        if not signal.serving:
            return _current(signal)
        if self.metric == "kv":
            return math.ceil(sum(r.kv_used for r in signal.serving) / self.target - 1e-9)
        self.demand.observe(signal)
        needed = self.demand.needed(signal, self.target)
        if needed is None:
            needed = math.ceil(sum(r.running + r.waiting for r in signal.serving) / self.target - 1e-9)
        return _bounded(signal, needed, self.demand)


@AUTOSCALE_POLICIES.register("queue")
class Queue(RegisteredPolicy):
    """Waiting requests above target_waiting per serving replica call for more replicas; with
    nothing waiting it asks for one fewer (the cooldown paces the descent), and in between for the
    serving count. How many more: the queue shows that the fleet is short, not by how much, and
    the requests in it stay where they wait, so the count is the replicas that serve the arrival
    rate at a replica's capacity (its binding resource) plus the time queues keep the serving ones busy
    (harness.autoscale.demand), and at least one more (the
    target is missed, and a new replica speeds the drain by taking arrivals off the replicas that
    hold the queue). Until that is measured, ceil(waiting / target_waiting)."""

    READS = ("target_waiting", "settle")

    @classmethod
    def from_config(cls, config: AutoscaleConfig, slo: SLO) -> ScalingPolicy:
        return cls(config.target_waiting)

    def __init__(self, target_waiting: float) -> None:
        self.target_waiting = target_waiting
        self.demand = Demand()

    def desired(self, signal: FleetSignal) -> int:
        self.demand.observe(signal)
        return _bounded(signal, self._wish(signal), self.demand)

    def _wish(self, signal: FleetSignal) -> int:
        waiting = sum(r.waiting for r in signal.serving)
        if waiting == 0:
            return _current(signal) - 1
        by_queue = math.ceil(waiting / self.target_waiting - 1e-9)
        serving = len(signal.serving)
        if by_queue <= serving:
            return serving
        needed = self.demand.needed(signal)
        return by_queue if needed is None else max(needed, serving + 1)


@AUTOSCALE_POLICIES.register("slo")
class SLOFeedback(RegisteredPolicy):
    """The window's P90 TTFT (requests still waiting count with their age so far) or TPOT against the
    SLO: more replicas above target x SLO, one fewer below scale_down_below x SLO. How many more
    (harness.autoscale.demand.MissSizing): as many as serve the arrival rate at a replica's capacity
    plus the time queues keep the serving ones busy, when that is more than the fleet holds (a
    settled fleet decides once per start-up, so one replica a decision would serve a surge that
    needs several one start-up at a time); otherwise one more when the longest queue will outlast
    a start-up and its replica is sent arrivals (a replica started now takes some of them off it
    before the queue is gone), none when it drains first; one more a decision until the demand
    is measured. One fewer only on a window's evidence (FleetSignal.evidence_s >= window_s): a P90
    of the first seconds of a run, or of the few requests since a start began to serve (settling),
    is no reason to drain a replica that takes a start-up to get back."""

    READS = ("slo_metric", "slo_target", "slo_scale_down_below", "settle")

    @classmethod
    def from_config(cls, config: AutoscaleConfig, slo: SLO) -> ScalingPolicy:
        bound = slo.ttft_p90_s if config.slo_metric == "ttft" else slo.tpot_p90_s
        assert bound is not None, "build_autoscale checks the SLO a policy needs"
        return cls(config.slo_metric, bound, slo.percentile, config.slo_target, config.slo_scale_down_below,
                   config.window_s)

    def __init__(self, metric: str, bound_s: float, percentile: float, target: float, down_below: float,
                 window_s: float) -> None:
        self.metric = metric
        self.bound_s = bound_s
        self.percentile = percentile
        self.target = target
        self.down_below = down_below
        self.window_s = window_s
        self.sizing = MissSizing(window_s)

    def desired(self, signal: FleetSignal) -> int:
        demand = self.sizing.demand
        demand.observe(signal)
        return _bounded(signal, self._wish(signal), demand)

    def _wish(self, signal: FleetSignal) -> int:
        values = signal.ttfts + signal.waiting_ages if self.metric == "ttft" else signal.tpots
        current = _current(signal)
        if not values:
            return current - 1 if not any(r.running or r.waiting for r in signal.serving) else current
        observed = float(np.percentile(values, self.percentile))
        if observed > self.target * self.bound_s:
            if self._miss_is_past(signal):
                self.sizing.met()
                return current
            return self.sizing.missed(signal)
        self.sizing.met()
        if observed < self.down_below * self.bound_s and signal.evidence_s >= self.window_s:
            return current - 1
        return current

    def _miss_is_past(self, signal: FleetSignal) -> bool:
        """A TTFT miss that no request shows now: no serving replica holds a queue, none of the
        requests waiting for their first token has waited past the target, and the fleet serves
        the highest arrival rate read over the time a replica takes to come back, at a full
        replica's measured capacity (Demand.floor, as a scale-down keeps). The window's misses then
        waited behind a queue since served (after a start, the backlog it answered, queued on the
        older replicas), and the P90 remembers them for a window. Otherwise (a fleet at the edge
        of the recent rate, or a modelled capacity only) such a miss is the fleet's recent
        shortage, and adds one as any miss without a queue does."""
        demand = self.sizing.demand
        limit = self.target * self.bound_s
        return (self.metric == "ttft" and demand.measured() and 0 < demand.floor(signal) <= _current(signal)
                and not any(r.backlog for r in signal.serving) and all(age <= limit for age in signal.waiting_ages))


@AUTOSCALE_POLICIES.register("schedule")
class Schedule(RegisteredPolicy):
    """A replica count set in advance: schedule [[t0, n0], [t1, n1], ...] asks for n_i replicas from
    t_i seconds on (before t0: as many as there are). It reads only the time, so an engine fleet,
    whose replicas report no queue or KV use, can run it: a second replica started mid-run, served
    and simulated alike. It never settles (Scaling.settle), so autoscale.settle is not its."""

    READS = ("schedule",)

    @classmethod
    def from_config(cls, config: AutoscaleConfig, slo: SLO) -> ScalingPolicy:
        assert config.schedule, "AutoscaleConfig checks that policy=schedule has a schedule"
        return cls(tuple((t, int(n)) for t, n in config.schedule))

    def __init__(self, steps: tuple[tuple[float, int], ...]) -> None:
        self.steps = steps

    def desired(self, signal: FleetSignal) -> int:
        wanted = [n for t, n in self.steps if t <= signal.now]
        return wanted[-1] if wanted else _current(signal)


def make_policy(config: AutoscaleConfig, slo: SLO) -> ScalingPolicy | None:
    """The configured policy, fresh for one run; None when autoscale.policy is null."""
    if config.policy is None:
        return None
    return AUTOSCALE_POLICIES.get(config.policy).from_config(config, slo)
