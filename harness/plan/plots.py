"""plan.png: every evaluated deployment's cost against its P90 TTFT and TPOT, with the Pareto frontier."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.output.figures import save_figure


def pareto_frontier(costs: np.ndarray, latencies: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both cost and latency, by rising cost."""
    order = np.lexsort((latencies, costs))
    frontier, best = [], np.inf
    for i in order:
        if latencies[i] < best:
            frontier.append(i)
            best = latencies[i]
    return np.array(frontier, dtype=int)


def plot_plan(table: pd.DataFrame, slo, title: str, path: Path) -> None:
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    axes = fig.subplots(1, 2)
    ok = table[table["error"] == ""] if len(table) else table
    for ax, metric, target, label in zip(axes, ("ttft_p90_s", "tpot_p90_s"), (slo.ttft_p90_s, slo.tpot_p90_s),
                                         ("TTFT P90 (s)", "TPOT P90 (s)")):
        data = ok[np.isfinite(ok[metric])] if metric in ok else ok.iloc[:0]
        for meets, colour, name in ((False, "tab:grey", "misses the SLO"), (True, "tab:green", "meets the SLO")):
            part = data[data["meets_slo"] == meets]
            ax.scatter(part["cost_per_hour"], part[metric], s=14, color=colour, alpha=0.7, label=name)
        if len(data):
            front = data.iloc[pareto_frontier(data["cost_per_hour"].to_numpy(), data[metric].to_numpy())]
            ax.step(front["cost_per_hour"], front[metric], where="post", color="tab:blue", label="Pareto frontier")
        ax.axhline(target, color="black", ls="--", lw=1, label=f"SLO {target:g} s")
        ax.set_yscale("log")
        ax.set_xlabel("fleet cost ($/hour)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Deployment search: {title}", fontsize=10)
    save_figure(fig, path)


def plot_modes(table: pd.DataFrame, slo, title: str, path: Path) -> None:
    """plan_modes.png: cost against the SLO ratio (worse P90 over its target; <= 1 meets the SLO) per mode."""
    fig = Figure(figsize=(7, 4.6), layout="constrained")
    ax = fig.subplots()
    ok = table[table["error"] == ""] if len(table) else table
    for mode, colour in (("aggregated", "tab:blue"), ("disaggregated", "tab:orange")):
        part = ok[(ok["mode"] == mode) & np.isfinite(ok["slo_ratio"])] if len(ok) else ok
        ax.scatter(part["cost_per_hour"], part["slo_ratio"], s=16, color=colour, alpha=0.7, label=mode)
    ax.axhline(1.0, color="black", ls="--", lw=1, label="SLO met below")
    ax.set_yscale("log")
    ax.set_xlabel("fleet cost ($/hour)")
    ax.set_ylabel("SLO ratio: max(P90 TTFT / target, P90 TPOT / target)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"Aggregated vs disaggregated: {title}", fontsize=10)
    save_figure(fig, path)
