"""PNG plots of a comparison: metrics side by side and per-step predicted vs measured (latency CDFs:
harness.output.plots.plot_latency_cdfs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.labels import metric_label
from harness.output.figures import save_figure

PANELS = (
    ("throughput (tok/s)", ("input_tok_s", "output_tok_s")),
    ("TTFT (s)", ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")),
    ("TPOT (s)", ("tpot_p50_s", "tpot_p90_s", "tpot_p99_s")),
    ("E2E (s)", ("e2e_p50_s", "e2e_p90_s", "e2e_p99_s")),
    ("preemptions (count)", ("preemptions",)),
    ("recomputed tokens (tokens)", ("recomputed_tokens",)),
)


def plot_metrics(table: pd.DataFrame, runs: list[str], path: Path, title: str) -> Figure:
    """Grouped bars: one panel per metric family, one bar per run. A family that is zero for every
    run gets no panel; a note under the title says so."""
    by_metric = table.set_index("metric")
    panels, flat = [], []
    for ylabel, metrics in PANELS:
        values = by_metric.loc[list(metrics), runs].to_numpy(dtype=float)
        (panels if np.nan_to_num(values).any() else flat).append((ylabel, metrics))
    heading = f"Simulated vs measured: {title}"
    if flat:
        heading += "\n" + "; ".join(f"{ylabel.split(' (')[0]}: 0 in every run" for ylabel, _ in flat)
    fig = Figure(figsize=(4.0 * max(1, len(panels)), 3.8), layout="constrained")
    fig.suptitle(heading, fontsize=10)
    axes = np.atleast_1d(fig.subplots(1, max(1, len(panels))))
    width = 0.8 / len(runs)
    for ax, (ylabel, metrics) in zip(axes, panels):
        x = np.arange(len(metrics))
        for i, run in enumerate(runs):
            ax.bar(x + (i - (len(runs) - 1) / 2) * width, [by_metric.loc[m, run] for m in metrics], width, label=run)
        ax.set_xticks(x, [metric_label(m).split(" (")[0] for m in metrics], fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    save_figure(fig, path)
    return fig


def plot_steps(replayed: pd.DataFrame, names: list[str], path: Path, title: str) -> Figure:
    """Per engine step: predicted vs measured (log-log, y = x dashed), and the relative errors."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    fig.suptitle(f"Step durations, cost models vs measured: {title}", fontsize=10)
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
    hist.set_ylabel("steps (count)")
    hist.legend(fontsize=8)
    hist.grid(alpha=0.3)
    save_figure(fig, path)
    return fig

