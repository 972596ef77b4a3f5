"""What a scaling policy sees and answers (every elastic fleet builds the same signal:
engine.core.elastic_states, engine.core.elastic, engine.core.elastic_wall, engine.core.disagg_elastic):
each serving replica's load, the fleet's demand and latencies at an evaluation, and the policy's
protocol, how many replicas the fleet should have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from engine.core.elastic_limits import ReplicaLimits


@dataclass(frozen=True)
class Served:
    """Requests a replica finished per second over an interval, and their mean prompt and output tokens."""

    rate: float
    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class ReplicaSignal:
    running: int
    waiting: int  # queued in the scheduler or routed and not yet admitted
    kv_used: float  # fraction of KV blocks in use, 0-1
    queued: int | None = None  # every request waiting, settled or not (None: as waiting)
    full: bool = False  # requests wait that it cannot admit (no sequence slot or KV for the next)
    budget_bound: bool = False  # its next step cannot take all it holds (engine.core.elastic_limits.budget_bound)
    # its share of FleetSignal.arrival_rate (req/s), as the router split the requests since the serving
    # replicas last changed (within the window); None where the fleet does not measure it
    arrival_rate: float | None = None
    # requests it finished per second since the previous evaluation, where it was full at that
    # evaluation and at this one: what a replica holding a queue serves; None otherwise, or where
    # the fleet does not measure it
    served_full: Served | None = None

    @property
    def backlog(self) -> int:
        return self.waiting if self.queued is None else self.queued


@dataclass(frozen=True)
class FleetSignal:
    """What a policy sees at an evaluation: each serving replica's load, how many are starting and
    draining, the TTFT and TPOT of requests finished within the window, how long each request
    still waiting for its first token has waited (its TTFT will be at least that), and the demand:
    the window's arrival rate (req/s) and the mean time a request finished in it spent in service
    (first scheduled to finished, s), the mean prompt tokens of those arrivals and output tokens of
    those finished requests; None where the fleet does not measure them. limits: a replica's
    resources (Scaling.limits)."""

    now: float
    serving: tuple[ReplicaSignal, ...]
    starting: int
    draining: int
    ttfts: tuple[float, ...]
    tpots: tuple[float, ...]
    waiting_ages: tuple[float, ...]
    arrival_rate: float | None = None
    service_s: float | None = None
    startup_s: float = 0.0  # how long a replica started now takes to serve
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    limits: ReplicaLimits | None = None
    interval_s: float = 0.0  # how often the policy is asked (s)
    # how long the requests it reads have been arriving (s): since the run began, or with settle
    # since the latest start began to serve
    evidence_s: float = math.inf
    settle: bool = False  # Scaling.settle: the policy holds further starts while one is pending (policies.py)
    scale_up_cooldown_s: float = 0.0  # Scaling's: how long after any action a start waits (s)


class ScalingPolicy(Protocol):
    def desired(self, signal: FleetSignal) -> int:
        """How many replicas (serving + starting) the fleet should have; the fleet clamps it to
        [min_replicas, max_replicas] and applies the cooldowns."""
