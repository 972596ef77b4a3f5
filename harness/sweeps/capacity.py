"""Capacity planning: the highest request rate a configuration serves within a latency SLO.

For each configuration (each value of study.param, or the base config alone) the workload is
replayed at Poisson (or gamma) rates chosen by bisection; a rate passes when the P<percentile>
TTFT and TPOT are both within the SLO. The search starts between rate_low (default: a quarter of
the offline throughput) and rate_high, where
rate_high defaults to the offline request throughput of the same requests; while the upper rate
still meets the SLO it is doubled, so the bracket always ends on a failing rate. A workload that
meets the SLO even offline (every request at once) meets it at any rate: its capacity is
unbounded by these requests, reported as inf with `slo_met_offline` and a warning, not searched.

NOTE: with a finite number of requests latency is not strictly monotone in the rate, so the
answer is the boundary bisection converged to, reported with every probe it made.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from harness.config import CapacityConfig, OutputConfig, RunConfig, build_run_config
from harness.convert import ConfigError
from harness.labels import metric_label, run_identity, table_title
from harness.output.figures import save_figure
from harness.output.metrics import percentile
from harness.run import run_once
from harness.run_folder import write_csv
from harness.sweeps.sweep import point_configs

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from harness.study import StudyConfig


def _with_rate(rc: RunConfig, arrival: str, rate: float | None) -> RunConfig:
    cv = rc.workload.cv if arrival == "gamma" else 1.0  # offline arrivals read no cv
    return dataclasses.replace(rc, workload=dataclasses.replace(rc.workload, arrival=arrival, rate=rate, cv=cv))


def _offline_run(rc: RunConfig, cap: CapacityConfig, progress: bool, label: str):
    """The configuration's offline run (every request at once) and whether it already meets the SLO."""
    p = cap.percentile
    offline = run_once(_with_rate(rc, "offline", None), progress, label=f"{label} offline")
    if not offline.summary.num_requests:
        # No throughput to start the bracket from (it would be NaN); say why instead.
        rid, error = next(iter(offline.rejected.items()), ("?", "no request served"))
        raise ConfigError(f"capacity search {label}: all {offline.summary.labels.num_submitted} requests were rejected "
                          f"at admission (e.g. {rid}: {error})")
    offline_ttft = percentile(offline.requests, "ttft", p)
    offline_tpot = percentile(offline.requests, "tpot", p)
    met_offline = bool(offline_ttft <= cap.ttft_slo_s and offline_tpot <= cap.tpot_slo_s)
    if met_offline:
        # Faster arrivals only bring the run closer to this one: every rate would pass, and the
        # doubling would end only at max_probes with a meaningless rate.
        log.warning("capacity search %s: all %d requests at once already meet the SLO (P%g TTFT %.3g s, TPOT %.3g s): "
                    "the workload is too small to bound the rate; raise workload.num_requests",
                    label or "base", offline.summary.num_requests, p, offline_ttft, offline_tpot)
    return offline, met_offline


def _bisect(probe: Callable[[float], bool], probes: list[dict], low: float, high: float,
            cap: CapacityConfig) -> tuple[float, bool]:
    """The highest rate found to pass, from the bracket [low, high), and whether max_probes cut the search."""
    if not probe(low):
        return 0.0, False
    # The offline throughput underestimates the steady state (its tail runs small batches):
    # double the upper rate until it fails the SLO, then bisect.
    capped = False
    while probe(high):
        low, high = high, 2.0 * high
        if len(probes) >= cap.max_probes:
            capped = True
            break
    while not capped and (high - low) / high > cap.rel_tol and len(probes) < cap.max_probes:
        mid = 0.5 * (low + high)
        if probe(mid):
            low = mid
        else:
            high = mid
    return low, capped


def search(rc: RunConfig, cap: CapacityConfig, progress: bool = False, label: str = "") -> tuple[dict, list[dict]]:
    """Bisect the rate for one configuration; returns (capacity row, probe rows)."""
    if rc.workload.arrival not in ("poisson", "gamma"):
        raise ConfigError("workload.arrival must be poisson or gamma for a capacity search, "
                          f"got {rc.workload.arrival!r}")
    p = cap.percentile
    probes: list[dict] = []

    def probe(rate: float) -> bool:
        outcome = run_once(_with_rate(rc, rc.workload.arrival, rate), progress, label=f"{label} rate={rate:.3g}")
        ttft = percentile(outcome.requests, "ttft", p)
        tpot = percentile(outcome.requests, "tpot", p)
        ok = bool(ttft <= cap.ttft_slo_s and tpot <= cap.tpot_slo_s)
        probes.append({"config": label, "rate": rate, f"ttft_p{p:g}_s": ttft, f"tpot_p{p:g}_s": tpot,
                       "meets_slo": ok, "output_tok_s": outcome.summary.output_tok_s,
                       "request_s": outcome.summary.request_s})
        return ok

    offline, met_offline = _offline_run(rc, cap, progress, label)
    high = cap.rate_high if cap.rate_high is not None else offline.summary.request_s
    low = cap.rate_low if cap.rate_low is not None else 0.25 * offline.summary.request_s
    if high <= low and not met_offline:
        raise ConfigError(f"study.capacity.rate_low={low} is not below the upper rate {high:.4g} req/s")
    capacity, capped = (math.inf, False) if met_offline else _bisect(probe, probes, low, high, cap)
    at = [r for r in probes if r["rate"] == capacity]
    row = {
        "config": label, **run_identity(rc), "capacity_req_s": capacity, "ttft_slo_s": cap.ttft_slo_s,
        "tpot_slo_s": cap.tpot_slo_s,
        "percentile": p, "offline_request_s": offline.summary.request_s, "num_probes": len(probes),
        "capped_by_max_probes": capped, "slo_met_offline": met_offline,
        f"ttft_p{p:g}_s_at_capacity": at[0][f"ttft_p{p:g}_s"] if at else np.nan,
        f"tpot_p{p:g}_s_at_capacity": at[0][f"tpot_p{p:g}_s"] if at else np.nan,
        "output_tok_s_at_capacity": at[0]["output_tok_s"] if at else np.nan,
    }
    return row, probes


def run_capacity(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    if study.param:
        points = [(f"{study.param}={v}", rc) for v, rc in point_configs(cfg, study)]
    else:
        points = [("base", build_run_config(cfg))]
    rows, probes = [], []
    for label, rc in points:
        row, point_probes = search(rc, study.capacity, output.progress, label)
        rows.append(row)
        probes.extend(point_probes)
    table = pd.DataFrame(rows)
    probe_table = pd.DataFrame(probes)
    write_csv(probe_table, out_dir / "capacity_probes.csv", index=False)
    write_csv(table, out_dir / "capacity.csv", index=False)
    plot_capacity(table, probe_table, study.capacity, out_dir / "capacity.png")
    return table


def plot_capacity(table: pd.DataFrame, probes: pd.DataFrame, cap: CapacityConfig, path: Path) -> Figure:
    from matplotlib.figure import Figure  # noqa: F811 (the runtime import; matplotlib loads only to plot)

    p = f"{cap.percentile:g}"
    fig = Figure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, 2)
    fig.suptitle(table_title(table, f"Capacity at P{p} SLOs"), fontsize=10)
    for ax, metric, slo in zip(axes, (f"ttft_p{p}_s", f"tpot_p{p}_s"), (cap.ttft_slo_s, cap.tpot_slo_s)):
        for _, row in table.iterrows():
            part = probes[probes["config"] == row["config"]].sort_values("rate") if len(probes) else probes
            line, = ax.plot(part.get("rate", []), part.get(metric, []), marker="o",
                            label=f"{row['config']}: {row['capacity_req_s']:.3g} req/s")
            if math.isfinite(row["capacity_req_s"]):
                ax.axvline(row["capacity_req_s"], color=line.get_color(), ls=":", lw=1)
        ax.axhline(slo, color="black", ls="--", lw=1, label="SLO")
        # log latency: past capacity it grows by orders of magnitude, and a linear axis from zero
        # would flatten every passing probe onto the floor; the rate axis starts at zero
        ax.set_yscale("log")
        ax.set_xlim(left=0)
        ax.set_xlabel(metric_label("rate"))
        ax.set_ylabel(metric_label(metric))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save_figure(fig, path)
    return fig
