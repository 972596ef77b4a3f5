"""What a scale-up can serve: the load policies (utilisation, queue, slo) size a surge on the arrival
rate against what a replica serves (its binding resource), not on the backlog queued on the serving replicas.

A queue built on the serving replicas stays there (requests do not move), so a new replica only
ever takes a share of the arrivals; and a replica that still holds a queue when a new one begins to
serve works through its own queue first (a least-loaded router sends arrivals elsewhere), taking
none of the arrivals meanwhile. Both follow from the fleet's signal (engine.core.elastic_states.
FleetSignal: the arrival rate since the previous evaluation, the mean time in service, each
replica's queue, the start-up time) by Little's law, with no threshold of their own.
"""

from __future__ import annotations

import math

from engine.core.elastic import FleetSignal


def sustained(signal: FleetSignal) -> float | None:
    """The requests the arrival stream keeps in service (Little's law: arrival rate x mean time in
    service), the load new replicas can take; held requests (running + waiting) count the queue as
    well. None until both are measured."""
    if signal.arrival_rate is None or signal.service_s is None:
        return None
    return signal.arrival_rate * signal.service_s


class Demand:
    """One run's measure of what a replica serves, in requests per second: the binding one of

    - its requests in service over the mean time in service (Little's law): held, the most a replica
      at its admission limit (ReplicaSignal.full: requests wait that it cannot admit, for want of a
      sequence slot or KV) has held at once, or before one has been full, what its
      limits hold: max_num_seqs, or its KV cache over a request's prompt and output tokens;
    - its token rate at its full token budget (ReplicaLimits.tokens_per_s, priced from the step
      model at the arrivals' mean prompt length) over a request's prompt and output tokens: a
      replica bound by its prompt tokens reaches it with few requests in service.
    """

    def __init__(self) -> None:
        self.full_running = 0

    def observe(self, signal: FleetSignal) -> None:
        held = [r.running for r in signal.serving if r.full]
        self.full_running = max([self.full_running, *held])

    def held(self, signal: FleetSignal) -> float | None:
        """Requests a replica holds in service at its admission limit; None where neither measured nor known."""
        if self.full_running:
            return float(self.full_running)
        limits, tokens = signal.limits, _request_tokens(signal)
        if limits is None or tokens is None:
            return None
        return float(min(limits.max_num_seqs, limits.kv_tokens / tokens))

    def capacity(self, signal: FleetSignal) -> float | None:
        """Requests per second one replica serves (the binding resource, above); None until a
        replica has been full or its limits and the demand's lengths are known."""
        rates = []
        held = self.held(signal)
        if held is not None and signal.service_s:
            rates.append(held / signal.service_s)
        tokens = _request_tokens(signal)
        priced = signal.limits.tokens_per_s if signal.limits is not None else None
        if priced is not None and tokens is not None and signal.prompt_tokens:
            rates.append(priced(signal.prompt_tokens) / tokens)
        return min(rates) if rates else None

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


class MissSizing:
    """How many replicas the slo policy asks for while the SLO is missed: what the demand needs
    (Demand.needed) when that is more than the fleet holds; otherwise the fleet is big enough and
    the miss is the backlog queued on the serving replicas, which drains on them without help (a
    new replica takes only a share of the arrivals, never the queue). One more replica only once the
    miss has lasted past the backlog's drain time (drain_s, estimated when the miss begins and again
    whenever the fleet's serving or starting count changes): a miss that outlasts the drain is one
    the measured capacity does not explain, and a miss without a backlog adds one at once. A met
    SLO ends the miss."""

    def __init__(self) -> None:
        self.demand = Demand()
        self.deadline: float | None = None
        self.fleet: tuple[int, int] | None = None  # (serving, starting) the deadline was set for

    def met(self) -> None:
        self.deadline = self.fleet = None

    def missed(self, signal: FleetSignal) -> int:
        current = len(signal.serving) + signal.starting
        needed = self.demand.needed(signal)
        capacity = self.demand.capacity(signal)
        if needed is None or capacity is None:
            return current + 1
        if needed > current:
            return needed
        fleet = (len(signal.serving), signal.starting)
        if self.deadline is None or fleet != self.fleet:
            drain = drain_s(signal, capacity)  # inf: the queue never drains, a reason to add now
            self.deadline = signal.now + drain if math.isfinite(drain) else signal.now
            self.fleet = fleet
        return current + 1 if signal.now >= self.deadline else current


def drain_s(signal: FleetSignal, capacity: float) -> float:
    """Seconds until the longest queue on a serving replica is served: each serves `capacity` req/s
    and takes its share of the arrivals, shared over the fleet as it will be (the replicas starting
    included); inf where a share is not below the capacity (the queue grows)."""
    backlog = max((r.backlog for r in signal.serving), default=0)
    if backlog == 0:
        return 0.0
    current = len(signal.serving) + signal.starting
    spare = capacity - (signal.arrival_rate or 0.0) / current
    return backlog / spare if spare > 0 else math.inf


def _request_tokens(signal: FleetSignal) -> float | None:
    """A request's prompt and output tokens (the arrivals' mean prompt, the finished requests' mean output)."""
    if signal.prompt_tokens is None or signal.output_tokens is None:
        return None
    return signal.prompt_tokens + signal.output_tokens or None
