"""autoscale.png: an autoscaled run against time, one panel per question, sharing the time axis."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from harness.autoscale.config import SLO
from harness.autoscale.timeline import STATES
from harness.output.figures import save_figure


def _time_axis(frame: pd.DataFrame) -> tuple[pd.Series, str]:
    span = float(frame["end_s"].max()) if len(frame) else 0.0
    if span > 3 * 3600:
        return frame["start_s"] / 3600.0, "time (h)"
    if span > 600:
        return frame["start_s"] / 60.0, "time (min)"
    return frame["start_s"], "time (s)"


def plot_autoscale(frame: pd.DataFrame, summary, slo: SLO, path: Path) -> None:
    """Arrival rate with replicas by state; KV use; TTFT percentiles; TPOT P90 and SLO attainment."""
    fig = Figure(figsize=(11, 10), layout="constrained")
    load, kv, ttft, tpot = fig.subplots(4, 1, sharex=True)
    t, xlabel = _time_axis(frame)
    load.step(t, frame["arrival_rate"], where="post", color="black", lw=1.0, label="arrival rate")
    load.set_ylabel("arrival rate (req/s)")
    replicas = load.twinx()
    replicas.stackplot(t, *[frame[s] for s in STATES], labels=list(STATES), step="post", alpha=0.35,
                       colors=["tab:orange", "tab:green", "tab:gray"])
    replicas.set_ylabel("replicas (mean per window)")
    lines, names = load.get_legend_handles_labels()
    more, more_names = replicas.get_legend_handles_labels()
    load.legend(lines + more, names + more_names, loc="upper left", fontsize=8)
    kv.plot(t, 100.0 * frame["kv_used"], lw=1.0)
    kv.set_ylabel("KV cache used (%)")
    kv.set_ylim(0, 105)
    ttft.plot(t, frame["ttft_p50_s"], lw=1.0, label="P50")
    ttft.plot(t, frame["ttft_p90_s"], lw=1.0, label="P90")
    if slo.ttft_p90_s is not None:
        ttft.axhline(slo.ttft_p90_s, color="red", ls="--", lw=0.8, label="SLO (P90)")
    ttft.set_ylabel("TTFT (s)")
    ttft.set_yscale("symlog", linthresh=0.1)
    ttft.legend(loc="upper left", fontsize=8)
    tpot.plot(t, 1000.0 * frame["tpot_p90_s"], lw=1.0, label="TPOT P90")
    if slo.tpot_p90_s is not None:
        tpot.axhline(1000.0 * slo.tpot_p90_s, color="red", ls="--", lw=0.8, label="TPOT SLO")
    tpot.set_ylabel("TPOT P90 (ms)")
    tpot.set_xlabel(xlabel)
    if slo.is_set:
        attained = tpot.twinx()
        attained.plot(t, 100.0 * frame["slo_attainment"], color="tab:purple", lw=0.8, label="SLO attainment")
        attained.set_ylabel("SLO attainment (%)")
        attained.set_ylim(0, 105)
        attained.legend(loc="lower right", fontsize=8)
    tpot.legend(loc="upper left", fontsize=8)
    for ax in (load, kv, ttft, tpot):
        ax.grid(alpha=0.3)
    row = summary.to_row()
    fig.suptitle(f"Autoscaling ({row['autoscale_policy']}): {row['model']} on {row['hardware']}, {row['workload']}; "
                 f"{row['gpu_hours']:.2f} GPU-hours, ${row['cost']:.2f}, SLO attainment "
                 f"{row['slo_attainment']:.3f}", fontsize=10)
    save_figure(fig, path)


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
