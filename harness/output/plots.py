"""PNG plots of a run and of a sweep.

matplotlib.figure.Figure is used directly (no pyplot): it renders with Agg and keeps no global
figure registry, so plotting works headless and in joblib workers. Titles name model, hardware,
workload and policy; axis names come from harness.labels.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from harness.labels import metric_label, run_title, table_title
from harness.output.figures import save_figure

log = logging.getLogger(__name__)

MAX_POINTS = 20000  # a timeline with more steps is thinned to about this many points


def plot_timeline(steps: pd.DataFrame, num_blocks: int, path: Path, summary: dict) -> Figure:
    """KV-cache usage and queue depths over time; summary: the run's summary row (for the title)."""
    if len(steps) > MAX_POINTS:
        steps = steps.iloc[:: len(steps) // MAX_POINTS + 1]
    fig = Figure(figsize=(9, 6), layout="constrained")
    kv, queue = fig.subplots(2, 1, sharex=True)
    fig.suptitle(run_title(summary, "KV cache and queues"), fontsize=10)
    time = steps["start"].to_numpy()
    kv.plot(time, 100.0 * (1.0 - steps["free_blocks"].to_numpy() / num_blocks), lw=0.8)
    kv.set_ylabel("KV cache used (%)")
    kv.set_ylim(0, 105)
    preempt = steps["preempted"].to_numpy() > 0
    if preempt.any():
        kv.scatter(time[preempt], np.full(preempt.sum(), 102.0), marker="|", color="tab:red", label="preemption")
        kv.legend(loc="lower right")
    queue.plot(time, steps["running"].to_numpy(), lw=0.8, label="running")
    queue.plot(time, steps["waiting"].to_numpy(), lw=0.8, label="waiting")
    queue.set_ylabel("requests (count)")
    queue.set_ylim(bottom=0)
    queue.set_xlabel("time (s)")
    queue.legend(loc="upper right")
    save_figure(fig, path)
    return fig


def plot_latency_cdfs(requests: pd.DataFrame | dict[str, pd.DataFrame], path: Path, title: str) -> Figure:
    """TTFT, TPOT and end-to-end CDFs of one run's requests, or of several runs (name -> requests), one
    line each; title: what ran (harness.labels.run_title)."""
    runs = requests if isinstance(requests, dict) else {None: requests}
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    fig.suptitle(f"Latency CDFs: {title}", fontsize=10)
    axes = fig.subplots(1, 3)
    for ax, metric, label in zip(axes, ("ttft", "tpot", "e2e"), ("TTFT", "TPOT", "end-to-end")):
        for run, frame in runs.items():
            values = np.sort(frame[metric].dropna().to_numpy())
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), label=run)
        ax.set_xlabel(f"{label} (s)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests (0-1)")
    if len(runs) > 1:
        axes[0].legend(fontsize=8)
    save_figure(fig, path)
    return fig


def plot_sweep(table: pd.DataFrame, x: str, metrics: tuple[str, ...], path: Path, log_x: bool = False,
               group: str | None = None, xlabel: str | None = None, title: str = "Sweep") -> Figure:
    """One panel per metric against x; one line per value of `group` when given; y axes start at
    zero. A metric that is zero (or missing) in every row gets no panel: it is named in a note
    under the title instead."""
    unknown = [m for m in metrics if m not in table.columns]
    if unknown:
        log.warning("not plotting %s: not summary columns (see summary.csv for the names)", unknown)
    metrics = tuple(m for m in metrics if m in table.columns)
    flat = [m for m in metrics if not pd.to_numeric(table[m], errors="coerce").fillna(0).ne(0).any()]
    metrics = tuple(m for m in metrics if m not in flat)
    cols = min(3, max(1, len(metrics)))
    rows = -(-len(metrics) // cols) if metrics else 1
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    heading = table_title(table, title)
    if flat:
        heading += "\n" + "; ".join(f"{metric_label(m)}: 0 in every run" for m in flat)
    fig.suptitle(heading, fontsize=10)
    numeric = pd.api.types.is_numeric_dtype(table[x])
    groups = [(None, table)] if group is None else list(table.groupby(group, sort=False))
    for ax, metric in zip(axes, metrics):
        for name, part in groups:
            label = None if name is None else str(name)
            if numeric:
                ax.plot(part[x].to_numpy(), part[metric].to_numpy(), marker="o", label=label)
            else:  # categories (policies, runs): bars
                ax.bar(np.arange(len(part)), part[metric].to_numpy(), label=label)
        if not numeric:
            labels = [str(v) for v in table[x]]
            long = max(map(len, labels), default=0) > 8
            ax.set_xticks(np.arange(len(table)), labels, rotation=30 if long else 0, ha="right" if long else "center",
                          fontsize=8 if long else 10)
        if log_x and numeric:
            ax.set_xscale("log")
        # from zero: a 0.2% change should look like one, not like a cliff
        lowest = pd.to_numeric(table[metric], errors="coerce").min()
        ax.set_ylim(bottom=min(0.0, lowest) if pd.notna(lowest) else 0.0)
        ax.set_xlabel(xlabel or metric_label(x))
        ax.set_ylabel(metric_label(metric))
        ax.grid(alpha=0.3)
        if group is not None:
            ax.legend(fontsize=8)
    for ax in axes[len(metrics):]:
        ax.set_visible(False)
    save_figure(fig, path)
    return fig
