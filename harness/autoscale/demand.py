"""What a scale-up can serve: the load policies (utilisation, queue, slo) size a surge on the arrival
rate against what a replica serves (its binding resource), not on the backlog queued on the serving replicas.

A queue built on the serving replicas stays there (requests do not move), so a new replica only
ever takes a share of the arrivals; and a replica that still holds a queue when a new one begins to
serve works through its own queue first (a least-loaded router sends arrivals elsewhere), taking
none of the arrivals meanwhile. Both follow from the fleet's signal (engine.core.fleet_signal.
FleetSignal: the arrival rate since the previous evaluation, the mean time in service, each
replica's queue, the start-up time) by Little's law, with no threshold of their own.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from engine.core.elastic import FleetSignal, ReplicaSignal, Served


def sustained(signal: FleetSignal) -> float | None:
    """The requests the arrival stream keeps in service (Little's law: arrival rate x mean time in
    service), the load new replicas can take; held requests (running + waiting) count the queue as
    well. None until both are measured."""
    if signal.arrival_rate is None or signal.service_s is None:
        return None
    return signal.arrival_rate * signal.service_s


class Demand:
    """One run's measure of what a replica serves, in requests per second: where a replica has been
    full (at its admission limit) at two evaluations running, what it finished in between
    (ReplicaSignal.served_full), priced for the current mix of requests by ServiceFit: what a
    replica holding a queue serves. Until then, modelled, the binding one of

    - its requests in service over the mean time in service (Little's law): held, the most a replica
      at its admission limit (ReplicaSignal.full: requests wait that it cannot admit, for want of a
      sequence slot or KV) has held at once, or before one has been full, what its
      limits hold: max_num_seqs, or its KV cache over a request's prompt and output tokens;
    - its token rate at its full token budget (ReplicaLimits.tokens_per_s, priced from the step
      model at the arrivals' mean prompt length) over a request's prompt and output tokens: a
      replica bound by its prompt tokens reaches it with few requests in service.

    The model overstates a loaded replica: the time in service it reads is the fleet's, most of it
    served below the limit, where steps are shorter (on the Azure Qwen3-32B study 3-6 req/s a
    replica, where a full one serves 2.0-3.4 as the mix moves).

    It also keeps the arrival rates read over the time a drained replica takes to come back, for
    the floor a scale-down keeps (floor).
    """

    def __init__(self) -> None:
        self.full_running = 0
        self.fit = ServiceFit()
        self.rates: deque[tuple[float, float]] = deque()  # (time, arrival rate) read

    def observe(self, signal: FleetSignal) -> None:
        held = [r.running for r in signal.serving if r.full]
        self.full_running = max([self.full_running, *held])
        for r in signal.serving:
            if r.served_full is not None:
                self.fit.add(r.served_full)
        if signal.arrival_rate is not None:
            self.rates.append((signal.now, signal.arrival_rate))
        while self.rates and self.rates[0][0] < signal.now - _return_s(signal):
            self.rates.popleft()

    def held(self, signal: FleetSignal) -> float | None:
        """Requests a replica holds in service at its admission limit; None where neither measured nor known."""
        if self.full_running:
            return float(self.full_running)
        limits, tokens = signal.limits, _request_tokens(signal)
        if limits is None or tokens is None:
            return None
        return float(min(limits.max_num_seqs, limits.kv_tokens / tokens))

    def capacity(self, signal: FleetSignal) -> float | None:
        """Requests per second one replica serves: measured on full replicas, else modelled (above);
        None until either is known."""
        measured = self.fit.rate(signal.prompt_tokens, signal.output_tokens)
        if measured is not None:
            return measured
        rates = []
        held = self.held(signal)
        if held is not None and signal.service_s:
            rates.append(held / signal.service_s)
        tokens = _request_tokens(signal)
        priced = signal.limits.tokens_per_s if signal.limits is not None else None
        if priced is not None and tokens is not None and signal.prompt_tokens:
            rates.append(priced(signal.prompt_tokens) / tokens)
        return min(rates) if rates else None

    def by_rate(self, signal: FleetSignal) -> int | None:
        """Replicas that serve the arrival rate at a replica's capacity; None until both are measured."""
        capacity = self.capacity(signal)
        if signal.arrival_rate is None or capacity is None:
            return None
        return math.ceil(signal.arrival_rate / capacity - 1e-9)

    def measured(self) -> bool:
        """Whether a full replica's service has been measured (else the capacity is modelled)."""
        return self.fit.coefficients() is not None

    def floor(self, signal: FleetSignal) -> int:
        """The fewest replicas a scale-down leaves: those that serve the highest arrival rate read
        over the time a replica drained now takes to come back (_return_s) at a full replica's
        measured capacity: a rate seen within it may return before a replica could. 0 until a full
        replica is measured: the modelled capacity is no floor (it overstated a loaded replica 2x on
        the Azure Qwen3-32B and Mooncake studies, and understated one by a fifth on the Azure trace
        at 4x on Qwen3-8B, where one replica is never full)."""
        capacity = self.capacity(signal)
        if capacity is None or not self.rates or not self.measured():
            return 0
        return math.ceil(max(rate for _, rate in self.rates) / capacity - 1e-9)

    def needed(self, signal: FleetSignal, per_replica: float | None = None) -> int | None:
        """Replicas that serve the arrival rate at a replica's capacity (and, given `per_replica`,
        that hold the requests it keeps in service at that many each), plus the serving replicas'
        share of the next start-up they spend on their own queues (stranded); None when the rate,
        or both capacity and per_replica, are not measured."""
        capacity, load = self.capacity(signal), sustained(signal)
        if signal.arrival_rate is None or (capacity is None and (per_replica is None or load is None)):
            return None
        wanted = [signal.arrival_rate / capacity] if capacity is not None else []
        if per_replica is not None and load is not None:
            wanted.append(load / per_replica)
        stranded = self.stranded(signal, capacity) if capacity is not None else 0.0
        return math.ceil(max(wanted) + stranded - 1e-9)

    def stranded(self, signal: FleetSignal, capacity: float) -> float:
        """Serving replicas' time, in replicas, spent on their own queues over one start-up from when
        a replica started now begins to serve: each holds its queue now plus its share of the
        arrivals less what it serves until then, and serves it at `capacity`; over that start-up
        (the time before another start could add capacity, and no shorter than the evaluation
        interval: a start-up shorter than that still waits for the next decision) the rest of its
        time goes to arrivals."""
        assert signal.arrival_rate is not None
        if not signal.serving:
            return 0.0
        share = signal.arrival_rate / len(signal.serving)
        horizon = max(signal.startup_s, signal.interval_s)
        busy = 0.0
        for r in signal.serving:
            queue = r.backlog + (share - capacity) * signal.startup_s
            if queue > 0:
                busy += min(1.0, queue / capacity / horizon) if horizon > 0 else 1.0
        return busy


class ServiceFit:
    """A full replica's time per request as prompt and output tokens cost it: t = a x prompt + b x
    output (a, b >= 0), fitted by least squares over the intervals a replica was full, each
    asking that its requests fill the interval (rate x t = 1). A replica bound by its KV or
    sequence slots spends its steps decoding, and one bound by its prompts prefilling; which one
    shows in the fit, so a rate measured in one mix is priced in another: on the Azure Qwen3-32B
    study a full replica served 2.0-3.4 req/s over 5-minute spans as the mean output moved from 250
    to 140 tokens, its output tokens 440-640 a second. Kept as running sums (a day of intervals)."""

    def __init__(self) -> None:
        self.sums = np.zeros(6)  # sum of x1^2, x1 x2, x2^2, x1, x2 (x = rate x tokens), and the count

    def add(self, served: Served) -> None:
        x1, x2 = served.rate * served.prompt_tokens, served.rate * served.output_tokens
        self.sums += (x1 * x1, x1 * x2, x2 * x2, x1, x2, 1.0)

    def rate(self, prompt_tokens: float | None, output_tokens: float | None) -> float | None:
        """Requests per second a full replica serves at this mix; None before an interval is fitted
        or without a mix."""
        coefficients = self.coefficients()
        if coefficients is None or prompt_tokens is None or output_tokens is None:
            return None
        seconds = coefficients[0] * prompt_tokens + coefficients[1] * output_tokens
        return 1.0 / seconds if seconds > 0 else None

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) >= 0 minimising sum (x1 a + x2 b - 1)^2; None before any interval."""
        s11, s12, s22, s1, s2, count = self.sums
        if not count:
            return None
        gram, target = np.array([[s11, s12], [s12, s22]]), np.array([s1, s2])
        both = np.linalg.lstsq(gram, target, rcond=None)[0]  # least norm where the mixes do not tell a and b apart
        if both.min() >= 0:
            return float(both[0]), float(both[1])
        # one cost alone: the one that leaves the smaller residual (sum (x a - 1)^2 = count - s^2 / sxx)
        alone = [(count - s * s / sxx if sxx > 0 else count, k, s / sxx if sxx > 0 else 0.0)
                 for k, (s, sxx) in enumerate(((s1, s11), (s2, s22)))]
        _, k, value = min(alone)
        return (value, 0.0) if k == 0 else (0.0, value)


class MissSizing:
    """How many replicas the slo policy asks for while the SLO is missed: what the demand needs
    (Demand.needed) when that is more than the fleet holds; otherwise the fleet serves the arrivals
    and the miss is the queue on the serving replicas. A new replica takes only arrivals, never a
    queue: it shortens the miss by taking arrivals off the replica that holds the longest queue
    (each one routed there waits behind the queue, and it drains only as fast as the replica
    serves more than it is sent), and only once it serves. So one more when that replica takes
    arrivals and its queue outlasts a start-up (drain time > FleetSignal.startup_s); none when the
    queue will be gone before a replica started now could serve, or when the replica holding it
    is sent nothing (a least-loaded router). The drain time is the longer of the modelled one
    (drain_s) and the one the queue has shown since the miss began or the fleet last changed (its
    length over how fast it shrank, read once it has been watched for `window_s`: between two
    evaluations a queue moves by a few requests either way as they arrive and finish; a rising
    arrival rate, or a replica slower than the fleet's measured capacity, slows it; a queue that
    grew does not drain). A miss without a queue behind it is no drain's: one more at once. A met
    SLO ends the miss."""

    def __init__(self, window_s: float = 0.0) -> None:
        self.demand = Demand()
        self.window_s = window_s  # the shortest watch a measured drain is read over
        self.fleet: tuple[int, int] | None = None  # (serving, starting) the queue is watched on
        self.since: tuple[float, int] = (0.0, 0)  # (time, longest queue) when that began
        self.estimate: float | None = None  # the latest decision's drain time (s); None: it had none

    def met(self) -> None:
        """The SLO is met (or the miss is no queue's): a later queue starts a watch of its own."""
        self.fleet = self.estimate = None

    def missed(self, signal: FleetSignal) -> int:
        current = len(signal.serving) + signal.starting
        needed = self.demand.needed(signal)
        capacity = self.demand.capacity(signal)
        holder = _holder(signal)
        if needed is None or capacity is None or needed > current or holder is None:
            self.met()
            return current + 1 if needed is None or needed <= current else needed
        self.estimate = self.drain_s(signal, capacity)
        if holder.arrival_rate == 0:
            return current
        return current + 1 if self.estimate > signal.startup_s else current

    def drain_s(self, signal: FleetSignal, capacity: float) -> float:
        """Seconds until the longest queue is served: the longer of the modelled drain and the
        measured one (inf where the queue has not shrunk since the watch began)."""
        fleet, longest = (len(signal.serving), signal.starting), _longest(signal)
        if fleet != self.fleet:
            self.fleet, self.since = fleet, (signal.now, longest)
        modelled = drain_s(signal, capacity)
        began, first = self.since
        if signal.now - began < max(self.window_s, 1e-9):
            return modelled
        shrinking = (first - longest) / (signal.now - began)
        return max(modelled, longest / shrinking if shrinking > 0 else math.inf)


def drain_s(signal: FleetSignal, capacity: float) -> float:
    """Seconds until the longest queue on a serving replica is served: its replica serves `capacity`
    req/s and takes the arrivals routed to it (ReplicaSignal.arrival_rate; where not measured, an
    even share of the fleet's), spread over the fleet as it will be (the replicas starting take
    their share once they serve); inf where that is not below the capacity (the queue grows)."""
    holder = _holder(signal)
    if holder is None:
        return 0.0
    current = len(signal.serving) + signal.starting
    if holder.arrival_rate is None:
        share = (signal.arrival_rate or 0.0) / current
    else:
        share = holder.arrival_rate * len(signal.serving) / current
    spare = capacity - share
    return holder.backlog / spare if spare > 0 else math.inf


def _return_s(signal: FleetSignal) -> float:
    """The soonest a replica drained now serves again: a scale-up cooldown, an evaluation, a start-up."""
    return signal.scale_up_cooldown_s + signal.interval_s + signal.startup_s


def _holder(signal: FleetSignal) -> ReplicaSignal | None:
    """The serving replica with the longest queue; None where none holds one."""
    holder = max(signal.serving, key=lambda r: r.backlog, default=None)
    return holder if holder is not None and holder.backlog > 0 else None


def _longest(signal: FleetSignal) -> int:
    return max((r.backlog for r in signal.serving), default=0)


def _request_tokens(signal: FleetSignal) -> float | None:
    """A request's prompt and output tokens (the arrivals' mean prompt, the finished requests' mean output)."""
    if signal.prompt_tokens is None or signal.output_tokens is None:
        return None
    return signal.prompt_tokens + signal.output_tokens or None
