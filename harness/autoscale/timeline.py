"""An autoscaled run over time: per-window arrival rate, replicas by state, KV use, latency
percentiles and SLO attainment (timeline.csv), and its cost from the replicas' lifetimes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from engine.core.elastic import Lifetime
from harness.autoscale.config import SLO

STATES = ("starting", "serving", "draining")
# the step columns an autoscaled run's summaries and timeline read (a day has 10^7 steps: only these
# are tabulated unless the step table is written)
TIMELINE_STEP_COLUMNS = ("prefill_tokens", "requests", "start", "free_blocks")


def attains(requests: pd.DataFrame, slo: SLO) -> pd.Series:
    """Per request: every set SLO target holds (a TPOT of a one-token output holds trivially)."""
    ok = pd.Series(True, index=requests.index)
    if slo.ttft_p90_s is not None:
        ok &= requests["ttft"] <= slo.ttft_p90_s
    if slo.tpot_p90_s is not None:
        ok &= requests["tpot"].isna() | (requests["tpot"] <= slo.tpot_p90_s)
    return ok


def state_spans(life: Lifetime) -> dict[str, tuple[float, float]]:
    """[from, to) of each state in the replica's life (empty spans where it never was in one)."""
    assert life.stop_s is not None, "lifetimes are closed at the end of the run"
    ready = min(life.ready_s, life.stop_s)
    drain = life.stop_s if life.drain_s is None else min(max(life.drain_s, ready), life.stop_s)
    return {"starting": (life.requested_s, ready), "serving": (ready, drain), "draining": (drain, life.stop_s)}


def gpu_hours(lifetimes: Sequence[Lifetime], tp_size: int) -> float:
    """GPU-hours billed: every replica from the moment it is requested (its cold start included)
    until it stops."""
    return sum((life.stop_s or 0.0) - life.requested_s for life in lifetimes) * tp_size / 3600.0


def peak_replicas(lifetimes: Sequence[Lifetime]) -> int:
    """The most replicas billed at once (from request to stop)."""
    return max((sum(1 for life in lifetimes if life.requested_s <= t < (life.stop_s or 0.0))
                for t in {life.requested_s for life in lifetimes}), default=0)


def timeline(requests: pd.DataFrame, steps: pd.DataFrame, lifetimes: Sequence[Lifetime], num_blocks: int,
             window_s: float, end_s: float, slo: SLO) -> pd.DataFrame:
    """One row per window of window_s seconds, the last one ending at end_s: arrivals and their
    rate, mean replicas in each state, mean KV use over the steps run, P50/P90 TTFT and P90 TPOT of
    the requests that arrived in it, and their SLO attainment (the fraction that met every set
    target; NaN without an SLO). Rates and means are over the window's own span."""
    count = max(1, math.ceil(end_s / window_s))
    edges = np.arange(count + 1) * window_s
    if end_s > edges[-2]:
        edges[-1] = end_s  # the last window ends with the run: its rates and means are over what it covers
    widths = np.diff(edges)
    frame = pd.DataFrame({"start_s": edges[:-1], "end_s": edges[1:]})
    which = np.clip((requests["arrival"].to_numpy() // window_s).astype(int), 0, count - 1)
    frame["arrivals"] = np.bincount(which, minlength=count)
    frame["arrival_rate"] = frame["arrivals"] / widths
    for state in STATES:
        frame[state] = 0.0
    for life in lifetimes:
        for state, (lo, hi) in state_spans(life).items():
            overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None)
            frame[state] += overlap / widths
    kv = pd.Series(np.nan, index=frame.index)
    if len(steps):
        used = 1.0 - steps["free_blocks"].to_numpy() / num_blocks
        step_window = np.clip((steps["start"].to_numpy() // window_s).astype(int), 0, count - 1)
        kv = pd.Series(used).groupby(step_window).mean().reindex(frame.index)
    frame["kv_used"] = kv.to_numpy()
    grouped = requests.assign(window=which).groupby("window")
    frame["ttft_p50_s"] = grouped["ttft"].quantile(0.5).reindex(frame.index).to_numpy()
    frame["ttft_p90_s"] = grouped["ttft"].quantile(0.9).reindex(frame.index).to_numpy()
    frame["tpot_p90_s"] = grouped["tpot"].quantile(0.9).reindex(frame.index).to_numpy()
    if slo.is_set:
        met = attains(requests, slo).to_numpy()
        frame["slo_attainment"] = pd.Series(met).groupby(which).mean().reindex(frame.index).to_numpy()
    else:
        frame["slo_attainment"] = np.nan
    return frame
