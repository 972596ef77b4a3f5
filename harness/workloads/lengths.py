"""Lengths and arrival times, as numpy arrays drawn from seeded generators."""

from __future__ import annotations

import numpy as np

from harness.convert import ConfigError
from harness.workloads.config import LengthConfig, WorkloadConfig


def draw_lengths(cfg: LengthConfig, n: int, rng: np.random.Generator, trace_column: np.ndarray | None) -> np.ndarray:
    """n lengths (int64): uniform in [low, high] inclusive, fixed, lognormal (rounded, clipped to
    [low, high]), or the trace column."""
    if cfg.dist == "uniform":
        return rng.integers(cfg.low, cfg.high + 1, size=n, dtype=np.int64)
    if cfg.dist == "lognormal":
        assert cfg.median is not None and cfg.sigma is not None, "validated by LengthConfig"
        drawn = np.rint(rng.lognormal(np.log(cfg.median), cfg.sigma, size=n))
        return np.clip(drawn, cfg.low, cfg.high).astype(np.int64)
    if cfg.dist == "fixed":
        return np.full(n, cfg.value, dtype=np.int64)
    assert trace_column is not None and len(trace_column) == n, "trace lengths were not loaded"
    return np.asarray(trace_column, dtype=np.int64).copy()


def draw_arrivals(cfg: WorkloadConfig, n: int, rng: np.random.Generator, trace_times: np.ndarray | None) -> np.ndarray:
    """n arrival times in seconds, the earliest at 0 (synthetic ones are non-decreasing); a time past
    the largest float (a request that would never arrive, and silently never be served) is an error."""
    arrival = _arrivals(cfg, n, rng, trace_times)
    if not np.isfinite(arrival).all():
        setting = f"workload.rate_scale={cfg.rate_scale}" if cfg.arrival == "trace" else f"workload.rate={cfg.rate}"
        raise ConfigError(f"{setting} puts {int((~np.isfinite(arrival)).sum())} of {n} arrival times at infinity "
                          "(past the largest float): those requests would never arrive")
    return arrival


def _arrivals(cfg: WorkloadConfig, n: int, rng: np.random.Generator, trace_times: np.ndarray | None) -> np.ndarray:
    if cfg.arrival == "offline":
        return np.zeros(n)
    if cfg.arrival == "trace":
        assert trace_times is not None and len(trace_times) == n, "trace arrivals were not loaded"
        # Row order is kept (lengths stay paired with their times); the loop sorts by arrival.
        times = np.asarray(trace_times, dtype=np.float64)
        with np.errstate(over="ignore"):  # an overflow is refused by draw_arrivals
            return (times - times.min()) / cfg.rate_scale
    mean_gap = 1.0 / cfg.rate
    if cfg.arrival == "poisson":
        gaps = rng.exponential(mean_gap, size=n)
    else:
        # Gamma inter-arrival gaps with mean 1/rate and coefficient of variation cv:
        # shape k = 1/cv^2 (k < 1 is burstier than Poisson), scale = mean / k.
        shape = 1.0 / (cfg.cv * cfg.cv)
        gaps = rng.gamma(shape, mean_gap / shape, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)
