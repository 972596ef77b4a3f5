"""Plots of a fleet run: the load on each replica over time and the fleet's latency CDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from harness.output.figures import save_figure
from harness.output.plots import MAX_POINTS


def _title(summary: dict, what: str) -> str:
    return (f"{what}: {summary.get('model', '?')} on {summary.get('replicas', '?')} x {summary.get('hardware', '?')} "
            f"(TP {summary.get('tp_sizes', '?')}), {summary.get('workload', '?')}, "
            f"policy {summary.get('policy', '?')}, "
            f"router {summary.get('router', '?')}")


def plot_fleet_load(outcome, path: Path) -> None:
    """Requests held (running + waiting) and KV cache used per replica, against time."""
    fig = Figure(figsize=(10, 6), layout="constrained")
    held, kv = fig.subplots(2, 1, sharex=True)
    for index, blocks in enumerate(outcome.replica_blocks):
        steps = outcome.steps[outcome.steps["replica"] == index]
        if len(steps) > MAX_POINTS:
            steps = steps.iloc[:: len(steps) // MAX_POINTS + 1]
        time = steps["start"].to_numpy()
        held.plot(time, (steps["running"] + steps["waiting"]).to_numpy(), lw=0.8, label=f"replica {index}")
        kv.plot(time, 100.0 * (1.0 - steps["free_blocks"].to_numpy() / blocks), lw=0.8, label=f"replica {index}")
    held.set_ylabel("requests held (running + waiting)")
    held.set_ylim(bottom=0)
    kv.set_ylabel("KV cache used (%)")
    kv.set_ylim(0, 105)
    kv.set_xlabel("time (s)")
    held.legend(loc="upper right", fontsize=8)
    held.grid(alpha=0.3)
    kv.grid(alpha=0.3)
    fig.suptitle(_title(outcome.summary, "Load per replica"), fontsize=10)
    save_figure(fig, path)


def plot_fleet_latency(outcome, path: Path) -> None:
    """TTFT, TPOT and end-to-end CDFs of the fleet (thick) and of each replica (thin)."""
    fig = Figure(figsize=(12, 4), layout="constrained")
    axes = fig.subplots(1, 3)
    requests = outcome.requests
    for ax, metric, label in zip(axes, ("ttft", "tpot", "e2e"), ("TTFT", "TPOT", "end-to-end latency")):
        parts = [("fleet", requests, 2.0)] + [
            (f"replica {i}", requests[requests["replica"] == i], 0.7) for i in range(len(outcome.replica_blocks))]
        for name, frame, width in parts:
            values = np.sort(frame[metric].dropna().to_numpy())
            if len(values):
                ax.plot(values, np.arange(1, len(values) + 1) / len(values), lw=width, label=name)
        ax.set_xlabel(f"{label} (s)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests (0-1)")
    if axes[0].lines:  # nothing served: empty axes and no legend
        axes[0].legend(fontsize=8)
    fig.suptitle(_title(outcome.summary, "Latency CDFs"), fontsize=10)
    save_figure(fig, path)
