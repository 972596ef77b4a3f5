"""autoscale.png: an autoscaled run against time, one panel per question, sharing the time axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from harness.autoscale.config import SLO
from harness.autoscale.timeline import STATES
from harness.output.figures import save_figure

TTFT_LINEAR_S = 0.1  # the TTFT axis is linear up to here (s), logarithmic above


def _time_axis(frame: pd.DataFrame) -> tuple[np.ndarray, str]:
    """The windows' edges (each start, then the last end) in a unit that suits the span."""
    edges = np.append(frame["start_s"].to_numpy(), frame["end_s"].to_numpy()[-1:])
    span = float(edges[-1]) if len(frame) else 0.0
    if span > 3 * 3600:
        return edges / 3600.0, "time (h)"
    if span > 600:
        return edges / 60.0, "time (min)"
    return edges, "time (s)"


def _held(values: pd.Series) -> np.ndarray:
    """A window's values against its edges: each held over its window, the last one to the run's end."""
    return np.append(values.to_numpy(), values.to_numpy()[-1:])


def plot_autoscale(frame: pd.DataFrame, summary, slo: SLO, path: Path) -> Figure:
    """Arrival rate with replicas by state; KV use; TTFT percentiles; TPOT P90 and SLO attainment."""
    fig = Figure(figsize=(11, 10), layout="constrained")
    load, kv, ttft, tpot = fig.subplots(4, 1, sharex=True)
    t, xlabel = _time_axis(frame)
    load.step(t, _held(frame["arrival_rate"]), where="post", color="black", lw=1.0, label="arrival rate")
    load.set_ylabel("arrival rate (req/s)")
    load.set_ylim(bottom=0.0)
    replicas = load.twinx()
    replicas.stackplot(t, *[_held(frame[s]) for s in STATES], labels=list(STATES), step="post", alpha=0.35,
                       colors=["tab:orange", "tab:green", "tab:gray"])
    replicas.set_ylabel("replicas (mean per window)")
    lines, names = load.get_legend_handles_labels()
    more, more_names = replicas.get_legend_handles_labels()
    load.legend(lines + more, names + more_names, loc="upper left", fontsize=8)
    kv.step(t, 100.0 * _held(frame["kv_used"]), where="post", lw=1.0)
    kv.set_ylabel("KV cache used (%)")
    kv.set_ylim(0, 105)
    _ttft_panel(ttft, t, frame, slo)
    tpot.step(t, 1000.0 * _held(frame["tpot_p90_s"]), where="post", lw=1.0, label="TPOT P90")
    if slo.tpot_p90_s is not None:
        tpot.axhline(1000.0 * slo.tpot_p90_s, color="red", ls="--", lw=0.8, label="TPOT SLO")
    tpot.set_ylabel("TPOT P90 (ms)")
    tpot.set_ylim(bottom=0.0)
    tpot.set_xlabel(xlabel)
    tpot.set_xlim(t[0], t[-1])
    if slo.is_set:
        attained = tpot.twinx()
        attained.step(t, 100.0 * _held(frame["slo_attainment"]), where="post", color="tab:purple", lw=0.8,
                      label="SLO attainment")
        attained.set_ylabel("SLO attainment (%)")
        attained.set_ylim(0, 105)
        attained.legend(loc="lower right", fontsize=8)
    tpot.legend(loc="upper left", fontsize=8)
    for ax in (load, kv, ttft, tpot):
        ax.grid(alpha=0.3)
    row = summary.to_row()
    attainment = f"SLO attainment {row['slo_attainment']:.3f}" if slo.is_set else "no SLO set"
    fig.suptitle(f"Autoscaling ({row['autoscale_policy']}): {row['model']} on {row['hardware']}, {row['workload']}; "
                 f"{row['gpu_hours']:.2f} GPU-hours, ${row['cost']:.2f}, {attainment}", fontsize=10)
    save_figure(fig, path)
    return fig


def _ttft_panel(ax, t: np.ndarray, frame: pd.DataFrame, slo: SLO) -> None:
    """TTFT percentiles on a scale linear below TTFT_LINEAR_S and logarithmic above (a surge's
    minutes beside a quiet fleet's milliseconds), its ticks plain seconds from 0."""
    ax.step(t, _held(frame["ttft_p50_s"]), where="post", lw=1.0, label="P50")
    ax.step(t, _held(frame["ttft_p90_s"]), where="post", lw=1.0, label="P90")
    if slo.ttft_p90_s is not None:
        ax.axhline(slo.ttft_p90_s, color="red", ls="--", lw=0.8, label="SLO (P90)")
    ax.set_ylabel("TTFT (s)")
    ax.set_yscale("symlog", linthresh=TTFT_LINEAR_S)
    # from 0 to at least the linear part's end, so the axis has ticks at 0 and TTFT_LINEAR_S however low the data
    ax.set_ylim(0.0, max(ax.get_ylim()[1], TTFT_LINEAR_S))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend(loc="upper left", fontsize=8)


def plot_cost_attainment(table: pd.DataFrame, slo: SLO, rc, path: Path) -> None:
    """experiment=autoscale: each run's cost against its SLO attainment, static fleets and policies."""
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    for (kind, policy), part in table.groupby(["kind", "policy"], sort=False):
        label = "static fleets" if kind == "static" else f"autoscale: {policy}"
        ax.scatter(100.0 * part["slo_attainment"], part["cost"], label=label, marker="s" if kind == "static" else "o")
        if kind == "static":
            for _, row in part.iterrows():
                ax.annotate(str(row["replicas"]), (100.0 * row["slo_attainment"], row["cost"]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
    ax.axvline(100.0 * slo.target_attainment, color="red", ls="--", lw=0.8, label="SLO met (P90)")
    ax.set_xlabel("SLO attainment (% of requests within every target)")
    ax.set_ylabel("cost ($, GPU-hours x price)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    targets = ", ".join(f"{k} {v:g} s" for k, v in (("TTFT P90", slo.ttft_p90_s), ("TPOT P90", slo.tpot_p90_s))
                        if v is not None)
    ax.set_title(f"Cost against SLO attainment: {rc.model.name} on {rc.hardware.name}, {rc.workload.label} "
                 f"({targets})", fontsize=10)
    save_figure(fig, path)
