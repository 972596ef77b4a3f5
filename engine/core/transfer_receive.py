"""The receive's side of a simulated KV transfer (engine.core.disagg_events uses it), each part
off unless asked for:

recv_behind_step: torch's NCCL receive, posted as the decode replica reserves, waits on the decode
GPU for the step in flight there (it is queued behind the current stream), and a point-to-point
move needs both ends, so the wire starts at the later of the send's start and the end of that
decode step (WireGates holds the three things it waits for).
landing_lag_s (with the handshake): the decode loop checks for landed receives that long after each
step's end (its host work after a step), so a wire that ends within that much after a step end is
seen then, and a landing seen at a later step boundary that much after it (LandingWatch).
send_lag_s (with the handshake): the prefill replica is told to send that long after the decode
replica reserved at its step boundary (its loop's host work, the router's pipes both ways).
landing_lag_sigma, send_lag_sigma: each lag is a host's work, which varies from one step boundary
(or one send) to the next; with sigma > 0 each is drawn from a lognormal of that median (the lag_s)
and sigma, or one sigma below the median and one above (LagDraw). The draw decides whether a wire
that ends near a step's end is seen at the check after it or a step later: a fixed lag makes that
a cliff at one transfer size.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import deque
from statistics import NormalDist

from engine.core.step_log import StepRecord, StepRun

SEND_START, RECV_START, WIRE_SECONDS = 0, 1, 2
RECENT_ENDS = 4  # a replica runs at most one step past the fleet's event, two with an overlapped one


class WireGates:
    """Per request: the send's start, the receive's start and the wire seconds, as each becomes known."""

    def __init__(self) -> None:
        self.gates: dict[str, list[float | None]] = {}

    def set(self, rid: str, which: int, value: float | None) -> tuple[float, float] | None:
        """Record one (None: not known yet); with all three, (the wire's start, its seconds)."""
        gate = self.gates.setdefault(rid, [None, None, None])
        gate[which] = value
        send, recv, seconds = gate
        if send is None or recv is None or seconds is None:
            return None
        del self.gates[rid]
        return max(send, recv), seconds


Sigma = float | tuple[float, float]


class LagDraw:
    """A host lag per occasion: median_s times exp(sigma z), z a standard normal drawn from the
    occasion's key alone, so the same occasion (a step end, a request) gets the same lag on every
    path that asks, and a run is reproducible. sigma is one number, or (below, above) the median: a
    host's lags are skewed (a floor of fixed work, a tail of busy iterations), P10 nearer the
    median than P90; sigma 0 is median_s always."""

    def __init__(self, median_s: float, sigma: Sigma = 0.0) -> None:
        self.median_s = median_s
        self.below, self.above = (sigma, sigma) if isinstance(sigma, int | float) else sigma

    def __bool__(self) -> bool:
        return self.median_s > 0

    def at(self, key: int) -> float:
        if not (self.below or self.above) or not self.median_s:
            return self.median_s
        u = min(max(random.Random(key).random(), 1e-9), 1 - 1e-9)
        z = NormalDist().inv_cdf(u)
        return self.median_s * math.exp((self.below if z < 0 else self.above) * z)

    def after_end(self, replica: int, end_s: float) -> float:
        """The lag after replica `replica`'s step that ended at end_s (keyed to the nanosecond)."""
        return self.at(hash((replica, round(end_s * 1e9))))

    def for_request(self, request_id: str) -> float:
        return self.at(zlib.crc32(request_id.encode()))


class LandingWatch:
    """A decode replica's loop checks for landed receives a lag after each of its steps' ends."""

    def __init__(self, lag: LagDraw) -> None:
        self.lag = lag
        self.ends: dict[int, deque[float]] = {}

    def stepped(self, decode: int, record: StepRecord | StepRun) -> None:
        ends = self.ends.setdefault(decode, deque(maxlen=RECENT_ENDS))
        if isinstance(record, StepRun):
            ends.extend(s + d for s, d in zip(record.starts[-RECENT_ENDS:], record.durations[-RECENT_ENDS:]))
        else:
            ends.append(record.start_s + record.duration_s)

    def seen(self, decode: int, t: float) -> float | None:
        """When a wire that ended at t is seen, if a step of the replica ended before t and its
        loop's check after that step comes at t or later (the first such check); else None (the
        next step boundary's check, its lag after it)."""
        checks = [e + self.lag.after_end(decode, e) for e in self.ends.get(decode, ()) if e <= t]
        checks = [c for c in checks if c >= t]
        return min(checks) if checks else None
