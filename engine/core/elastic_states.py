"""What every elastic fleet shares (engine.core.elastic's simulated one, engine.core.disagg_elastic's
pools, engine.core.elastic_wall's engine processes): a new replica's priced start-up, the scaling
rules, the lifetimes and scale events, and FleetStates, the bookkeeping of which replicas are
starting, serving and draining and how an evaluation acts; SimulatedStates adds what the two
simulated fleets share: replicas on their own clocks, each starting one ready at its time. What a
policy sees (FleetSignal) and answers (ScalingPolicy) is engine.core.fleet_signal's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.core.elastic_limits import ReplicaLimits
from engine.core.fleet import FleetResult
from engine.core.fleet_signal import FleetSignal, ScalingPolicy
from engine.core.loop import Replica
from engine.core.request import Request


@dataclass(frozen=True)
class ColdStart:
    """A new replica's start-up, in seconds: provisioning (a machine, a container), loading the
    weights, capturing CUDA graphs, and the rest of the engine's own start (process_s: the
    interpreter and its imports, sizing and allocating the KV cache). It takes traffic after total_s."""

    provision_s: float = 0.0
    load_s: float = 0.0
    capture_s: float = 0.0
    process_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.provision_s + self.process_s + self.load_s + self.capture_s


@dataclass(frozen=True)
class Scaling:
    """How the fleet scales: bounds, how often the policy is asked, cooldowns (an action waits this
    long after the previous action of either direction), how many replicas one evaluation may drain,
    the sliding window of finished requests the policy sees, and whether it settles (below)."""

    min_replicas: int
    max_replicas: int
    interval_s: float
    scale_up_cooldown_s: float
    scale_down_cooldown_s: float
    max_scale_down: int
    window_s: float
    cold_start: ColdStart
    # settle: once a started replica serves, the policy reads only requests that arrived since
    # (their latencies, waiting ages and queue), and while one starts it asks for more only where the
    # arrival rate needs more than serve and start (FleetSignal.settle; harness.autoscale.policies).
    # The capacity a start brings cannot show in what a policy reads before it serves, and a backlog
    # queued on the older replicas before then stays on them (requests do not move): judged on
    # either, every evaluation would ask again for the replicas the pending start already answers.
    settle: bool = False
    limits: ReplicaLimits | None = None  # a replica's resources, for sizing on demand (None: not known)


@dataclass(frozen=True)
class Demanded:
    """What FleetStates._demand measures (FleetSignal's fields of the same names)."""

    arrival_rate: float | None
    service_s: float | None
    prompt_tokens: float | None
    output_tokens: float | None


def _mean(values: list[float] | list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def scale_by(want: int, current: int, since_last_action_s: float, scaling: Scaling) -> int:
    """How many replicas to start (> 0) or to take away (< 0) now: the policy's wish clamped to
    [min_replicas, max_replicas], an action waiting its cooldown after the previous one of either
    direction, at most max_scale_down taken away at once. (With settle, what a policy asks for while
    a replica starts is the policy's to decide: FleetSignal.settle.)"""
    want = min(max(want, scaling.min_replicas), scaling.max_replicas)
    if want > current and since_last_action_s >= scaling.scale_up_cooldown_s:
        return want - current
    if want < current and since_last_action_s >= scaling.scale_down_cooldown_s:
        return -min(current - want, scaling.max_scale_down)
    return 0


# (finish, ttft, tpot or nan, arrival, service or nan, output tokens)
Finished = tuple[float, float, float, float, float, int]


def finished_latencies(r: Request) -> Finished | None:
    """(finish, TTFT, TPOT or NaN for a one-token output, arrival, time in service from first
    scheduled to finished or NaN where unknown, output tokens) of a finished request, as a policy's
    window holds them; None for one that never produced a token."""
    if r.first_token_time is None or r.finish_time is None:
        return None
    decode = r.num_output_tokens - 1
    tpot = (r.finish_time - r.first_token_time) / decode if decode > 0 else math.nan
    service = r.finish_time - r.first_scheduled_time if r.first_scheduled_time is not None else math.nan
    return r.finish_time, r.first_token_time - r.arrival_time, tpot, r.arrival_time, service, r.num_output_tokens


@dataclass
class Lifetime:
    index: int
    requested_s: float
    ready_s: float
    drain_s: float | None = None
    stop_s: float | None = None  # None until it stops; the run's end for those still serving then
    cancelled: bool = False  # stopped while still starting


@dataclass(frozen=True)
class ScaleEvent:
    time_s: float
    direction: str  # "up" or "down"
    replicas: tuple[int, ...]  # the replicas started, or drained / cancelled


@dataclass
class ElasticResult:
    fleet: FleetResult
    lifetimes: list[Lifetime]
    events: list[ScaleEvent] = field(default_factory=list)


class FleetStates:
    """The bookkeeping a simulated (run_elastic) and an engine (engine.core.elastic_wall) elastic
    fleet share: which replicas are starting, serving and draining, their lifetimes, the scale
    events, the window of finished requests a policy sees, and how an evaluation acts."""

    def __init__(self, scaling: Scaling, policy: ScalingPolicy | None) -> None:
        self.scaling = scaling
        self.policy = policy
        self.lifetimes: list[Lifetime] = []
        self.serving: list[int] = []
        self.starting: list[int] = []
        self.draining: list[int] = []
        self.events: list[ScaleEvent] = []
        self.last_action = -math.inf
        self.settled = -math.inf  # when the latest started replica began to serve (Scaling.settle)
        self.finished: deque[Finished] = deque()
        self.arrivals: deque[tuple[float, int]] = deque()  # (time, prompt tokens) within the window (arrived)

    def _new_lifetime(self, now: float, ready: float) -> int:
        index = len(self.lifetimes)
        self.lifetimes.append(Lifetime(index, now, ready))
        return index

    def _record_finished(self, finished: Iterable[Request]) -> None:
        for r in finished:
            if (entry := finished_latencies(r)) is not None:
                self.finished.append(entry)

    def fresh(self, arrival: float) -> bool:
        """Whether a request that arrived then counts in what the policy reads (Scaling.settle)."""
        return not self.scaling.settle or arrival >= self.settled

    def _became_ready(self, now: float) -> None:
        self.settled = max(self.settled, now)

    def evidence_s(self, now: float) -> float:
        """FleetSignal.evidence_s: how long the requests a policy reads have been arriving."""
        return now - max(0.0, self.settled if self.scaling.settle else 0.0)

    def arrived(self, time_s: float, prompt_tokens: int = 0) -> None:
        """A request arrived at the fleet (for the arrival rate and prompt length a policy reads)."""
        self.arrivals.append((time_s, prompt_tokens))

    def _since(self, now: float, queued: bool) -> float:
        """Where the span of the demand's arrival rate begins (_demand says why)."""
        return max(now - (self.scaling.interval_s if queued else self.scaling.window_s), 0.0)

    def _demand(self, now: float, queued: bool) -> Demanded:
        """The arrival rate and the mean time in service (first scheduled to finished) of the
        requests finished, over the window, or, while a serving replica has a queue, since the
        previous evaluation; None for either not measurable yet. A queue shows the replicas at
        their admission limit, the demand above what they serve: the newest interval shows a surge
        at once, where the window's mean dilutes it with the quieter time before. Without a queue
        nothing is short, and the window's many more arrivals keep a few seconds' noise at low
        rates from reading as a change. Settling leaves both whole: an arrival rate is no backlog,
        and a request's time in service does not count the time it waited. With them, the mean
        prompt tokens of those arrivals and output tokens of those finished requests (Demanded).
        Call after _window, which drops the finished requests older than the window."""
        while self.arrivals and self.arrivals[0][0] <= now - self.scaling.window_s:
            self.arrivals.popleft()
        since = self._since(now, queued)
        prompts = [p for t, p in self.arrivals if since < t <= now]
        rate = len(prompts) / (now - since) if now > since else None
        latest = [f for f in self.finished if f[0] > since and f[4] == f[4]]
        served = latest or [f for f in self.finished if f[4] == f[4]]
        return Demanded(rate, _mean([f[4] for f in served]), _mean(prompts) if prompts else None,
                        _mean([f[5] for f in served]))

    def _window(self, now: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """TTFTs and TPOTs of the requests finished within window_s before now (with settle: of
        those that arrived since the latest start began to serve)."""
        while self.finished and self.finished[0][0] < now - self.scaling.window_s:
            self.finished.popleft()
        window = [f for f in self.finished if self.fresh(f[3])]
        return tuple(f[1] for f in window), tuple(f[2] for f in window if f[2] == f[2])

    def _change(self, signal: FleetSignal) -> int:
        assert self.policy is not None
        return scale_by(self.policy.desired(signal), len(self.serving) + len(self.starting),
                        signal.now - self.last_action, self.scaling)

    def _acted(self, event: ScaleEvent) -> None:
        self.events.append(event)
        self.last_action = event.time_s

    def _remove(self, now: float, count: int, outstanding: Callable[[int], int]) -> list[int]:
        """Cancel the newest starting replicas first, then drain the serving ones holding the fewest
        requests (outstanding(index); ties: the newest)."""
        removed = []
        for _ in range(count):
            if self.starting:
                index = self.starting.pop()
                life = self.lifetimes[index]
                life.drain_s = life.stop_s = now
                life.cancelled = True
            else:
                index = min(reversed(self.serving), key=outstanding)
                self.serving.remove(index)
                self.draining.append(index)
                self.lifetimes[index].drain_s = now
            removed.append(index)
        return removed


class SimulatedStates(FleetStates):
    """FleetStates over simulated replicas (self.replicas, by index, each on its own clock): a
    starting replica serves from its ready time on, its clock moved there."""

    def __init__(self, scaling: Scaling, policy: ScalingPolicy | None) -> None:
        super().__init__(scaling, policy)
        self.replicas: list[Replica] = []  # every replica made, by index

    def next_ready(self) -> float:
        return min((self.lifetimes[i].ready_s for i in self.starting), default=math.inf)

    def promote(self, now: float) -> None:
        for index in [i for i in self.starting if self.lifetimes[i].ready_s <= now]:
            self.starting.remove(index)
            self.replicas[index].clock.wait_until(self.lifetimes[index].ready_s)
            self.serving.append(index)
            self._became_ready(self.lifetimes[index].ready_s)

    def waiting_signal(self, replica: Replica, now: float) -> tuple[int, list[float]]:
        """How many requests a replica holds waiting to be admitted (queued in its scheduler or
        routed and not yet taken in), and the ages of those still waiting for their first token;
        with settle, only of requests that arrived since the latest start began to serve."""
        scheduler = replica.scheduler
        if not self.scaling.settle:
            ages = [now - r.arrival_time for r in scheduler.requests.values() if r.first_token_time is None]
            return scheduler.num_waiting + len(replica.inbox), ages + [now - r.arrival_time for r in replica.inbox]
        inbox = [r for r in replica.inbox if r.arrival_time >= self.settled]
        waiting = sum(1 for r in scheduler.waiting if r.arrival_time >= self.settled) + len(inbox)
        ages = [now - r.arrival_time for r in scheduler.requests.values()
                if r.first_token_time is None and r.arrival_time >= self.settled]
        return waiting, ages + [now - r.arrival_time for r in inbox]
