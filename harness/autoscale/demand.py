"""What a scale-up can serve: the load policies (utilisation, queue, slo) size a surge on the arrival
rate against what a full replica serves, not on the backlog queued on the serving replicas.

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
    """One run's measure of a full replica: the most requests a replica at its admission limit
    (ReplicaSignal.full: requests wait that it cannot admit, for want of a sequence slot or KV)
    has held in service at once."""

    def __init__(self) -> None:
        self.full_running = 0

    def observe(self, signal: FleetSignal) -> None:
        held = [r.running for r in signal.serving if r.full]
        self.full_running = max([self.full_running, *held])

    def capacity(self, signal: FleetSignal) -> float | None:
        """Requests per second one full replica serves (Little's law: its requests in service over
        the mean time in service); None until a replica has been full or the time is measured."""
        if not self.full_running or not signal.service_s:
            return None
        return self.full_running / signal.service_s

    def needed(self, signal: FleetSignal, per_replica: float | None = None) -> int | None:
        """Replicas that serve the arrival rate, each holding `per_replica` requests in service
        (default: a full replica's count), plus the serving replicas' share of the next start-up
        they spend on their own queues (stranded); None when the rate or capacity is not measured."""
        capacity, load = self.capacity(signal), sustained(signal)
        if load is None or (per_replica is None and capacity is None):
            return None
        stranded = self.stranded(signal, capacity) if capacity is not None else 0.0
        return math.ceil(load / (per_replica or self.full_running) + stranded - 1e-9)

    def stranded(self, signal: FleetSignal, capacity: float) -> float:
        """Serving replicas' time, in replicas, spent on their own queues over one start-up from when
        a replica started now begins to serve: each holds its queue now plus its share of the
        arrivals less what it serves until then, and serves it at `capacity`; over that start-up
        (the time before another start could add capacity) the rest of its time goes to arrivals."""
        assert signal.arrival_rate is not None
        if not signal.serving:
            return 0.0
        share = signal.arrival_rate / len(signal.serving)
        busy = 0.0
        for r in signal.serving:
            queue = r.backlog + (share - capacity) * signal.startup_s
            if queue > 0:
                busy += min(1.0, queue / capacity / signal.startup_s) if signal.startup_s > 0 else 1.0
        return busy
