"""PNG plots of a comparison: metrics side by side and per-step predicted vs measured (latency CDFs:
harness.plots.plot_latency_cdfs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

PANELS = (
    ("throughput (tok/s)", ("input_tok_s", "output_tok_s")),
    ("TTFT (s)", ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")),
    ("TPOT (s)", ("tpot_p50_s", "tpot_p90_s", "tpot_p99_s")),
    ("end-to-end (s)", ("e2e_p50_s", "e2e_p90_s", "e2e_p99_s")),
    ("preemption", ("preemptions", "recomputed_tokens")),
)


def plot_metrics(table: pd.DataFrame, runs: list[str], path: Path) -> None:
    """Grouped bars: one panel per metric family, one bar per run."""
    by_metric = table.set_index("metric")
    fig = Figure(figsize=(4.0 * len(PANELS), 3.6), layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    width = 0.8 / len(runs)
    for ax, (title, metrics) in zip(axes, PANELS):
        x = np.arange(len(metrics))
        for i, run in enumerate(runs):
            ax.bar(x + (i - (len(runs) - 1) / 2) * width, [by_metric.loc[m, run] for m in metrics], width, label=run)
        ax.set_xticks(x, [m.removesuffix("_s").removesuffix("_tok") for m in metrics], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=110)


def plot_steps(replayed: pd.DataFrame, names: list[str], path: Path) -> None:
    """Per engine step: predicted vs measured (log-log, y = x dashed), and the relative errors."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    scatter, hist = fig.subplots(1, 2)
    measured = replayed["measured_s"].to_numpy()
    for name in names:
        predicted = replayed[f"predicted_{name}_s"].to_numpy()
        scatter.scatter(measured * 1e3, predicted * 1e3, s=4, alpha=0.4, label=name)
        err = replayed[f"err_{name}"].to_numpy()
        err = err[np.isfinite(err)]
        if len(err):
            lo, hi = np.percentile(err, [0.5, 99.5])
            hist.hist(np.clip(err, lo, hi) * 100, bins=60, alpha=0.5,
                      label=f"{name}: median |err| {np.median(np.abs(err)):.1%}")
    positive = measured[measured > 0]
    if len(positive):
        lims = [positive.min() * 1e3 * 0.8, positive.max() * 1e3 * 1.25]
        scatter.plot(lims, lims, "k--", lw=1)
    scatter.set_xscale("log")
    scatter.set_yscale("log")
    scatter.set_xlabel("measured step (ms)")
    scatter.set_ylabel("predicted step (ms)")
    scatter.legend(fontsize=8)
    scatter.grid(alpha=0.3)
    hist.set_xlabel("relative error of a step (%), clipped to its 0.5-99.5 percentiles")
    hist.set_ylabel("steps")
    hist.legend(fontsize=8)
    hist.grid(alpha=0.3)
    fig.savefig(path, dpi=110)

