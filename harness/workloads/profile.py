"""Arrivals whose rate changes over the run: a piecewise-constant rate profile, optionally periodic.

workload.rate_profile=[[t0, r0], [t1, r1], ...]: r_i req/s from t_i seconds until t_{i+1} (t0 = 0,
times increasing, rates >= 0). With rate_period_s the profile repeats every period (every t_i below
it). Arrivals stop at duration_s; null: one period when periodic, else the last time plus the
length of the segment before it (three 600 s segments for [[0,5],[600,40],[1200,10]]).

NOTE: arrivals are drawn by inversion. A unit-rate renewal process (exponential gaps for poisson,
gamma gaps of mean 1 and coefficient of variation cv for gamma) is mapped through the inverse of
the cumulative rate L(t) = integral of the rate up to t, which for exponential gaps is exactly a
Poisson process of the profile's rate; gamma gaps keep their burstiness relative to the local rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Profile = tuple[tuple[float, float], ...]
# a periodic profile is unrolled over the run: past this many segments its arrays outgrow any run
MAX_SEGMENTS = 10**7


def check_profile(profile: Sequence[Sequence[float]], period_s: float | None, duration_s: float | None) -> None:
    """A ValueError naming the field for a profile that is not [[0, r0], [t1, r1], ...] with increasing
    times and rates >= 0 (one > 0), or a period or duration that does not fit it."""
    where = "workload.rate_profile"
    if not profile:
        raise ValueError(f"{where} must list [time_s, rate] pairs, the first at time 0, got []")
    for i, pair in enumerate(profile):
        if len(pair) != 2 or not all(math.isfinite(v) for v in pair):
            raise ValueError(f"{where}[{i}] must be a [time_s, rate] pair of finite numbers, got {list(pair)}")
        if pair[0] < 0:
            raise ValueError(f"{where}[{i}]: time {pair[0]} is negative (times are seconds from the start, >= 0)")
        if pair[1] < 0:
            raise ValueError(f"{where}[{i}]: rate {pair[1]} is negative (req/s, >= 0)")
        if i and pair[0] <= profile[i - 1][0]:
            raise ValueError(f"{where}[{i}]: time {pair[0]} is not after the previous time {profile[i - 1][0]} "
                             "(times must increase)")
    if profile[0][0] != 0:
        raise ValueError(f"{where}[0]: the first time must be 0, got {profile[0][0]}")
    if not any(rate > 0 for _, rate in profile):
        raise ValueError(f"{where}: every rate is 0, so nothing would arrive")
    if period_s is not None and not period_s > profile[-1][0]:
        raise ValueError(f"workload.rate_period_s={period_s} must be after the profile's last time {profile[-1][0]}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"workload.duration_s must be > 0 (seconds), got {duration_s}")
    if period_s is not None and duration_s is not None and \
            (segments := math.ceil(duration_s / period_s) * len(profile)) > MAX_SEGMENTS:
        raise ValueError(f"workload.rate_period_s={period_s:g} repeats the profile's {len(profile)} segments "
                         f"{math.ceil(duration_s / period_s):.3g} times over {duration_s:g} s: more than "
                         f"{MAX_SEGMENTS:.0e} ({segments:.3g}); raise the period or shorten workload.duration_s")
    if period_s is None and duration_s is None and len(profile) == 1:
        raise ValueError(f"{where} has one segment with no end: set workload.duration_s (seconds) or "
                         "workload.rate_period_s")


def profile_end(profile: Profile, period_s: float | None, duration_s: float | None) -> float:
    """When arrivals stop (the module docstring's rule)."""
    if duration_s is not None:
        return duration_s
    if period_s is not None:
        return period_s
    return profile[-1][0] + (profile[-1][0] - profile[-2][0])


def breakpoints(profile: Profile, period_s: float | None, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(times, rates) of the piecewise-constant rate over [0, end_s], periods unrolled."""
    times = np.array([t for t, _ in profile], dtype=float)
    rates = np.array([r for _, r in profile], dtype=float)
    if period_s is not None:
        cycles = math.ceil(end_s / period_s)
        times = (times[None, :] + period_s * np.arange(cycles)[:, None]).ravel()
        rates = np.tile(rates, cycles)
    keep = times < end_s
    return times[keep], rates[keep]


def rate_at(profile: Profile, period_s: float | None, t: np.ndarray) -> np.ndarray:
    """The profile's rate (req/s) at times t."""
    times = np.array([p[0] for p in profile])
    rates = np.array([p[1] for p in profile])
    local = np.mod(t, period_s) if period_s is not None else np.asarray(t, dtype=float)
    return rates[np.searchsorted(times, local, side="right") - 1]


def _cumulative(profile: Profile, period_s: float | None, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(edges, L at each edge): the segments' edges over [0, end_s] and the cumulative rate there."""
    times, rates = breakpoints(profile, period_s, end_s)
    edges = np.append(times, end_s)
    return edges, np.concatenate([[0.0], np.cumsum(rates * np.diff(edges))])


def expected_arrivals(profile: Profile, period_s: float | None, end_s: float) -> float:
    """The mean number of arrivals over [0, end_s): the integral of the rate."""
    return float(_cumulative(profile, period_s, end_s)[1][-1])


def profile_arrivals(profile: Profile, period_s: float | None, end_s: float, arrival: str, cv: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, end_s), non-decreasing, drawn by inversion (see the module NOTE)."""
    edges, cumulative = _cumulative(profile, period_s, end_s)
    total = cumulative[-1]
    units: list[np.ndarray] = []
    reached, chunk = 0.0, int(total + 10 * math.sqrt(total + 1) + 16)
    while reached <= total:
        if arrival == "poisson":
            gaps = rng.exponential(1.0, size=chunk)
        else:
            shape = 1.0 / (cv * cv)
            gaps = rng.gamma(shape, 1.0 / shape, size=chunk)
        sums = reached + np.cumsum(gaps)
        units.append(sums)
        reached = float(sums[-1])
    unit = np.concatenate(units)
    unit = unit[unit < total]
    # L is flat over zero-rate segments: interp maps into the segment ends, never inside them
    return np.interp(unit, cumulative, edges)
