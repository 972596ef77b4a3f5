"""pools.png: each pool's busy share and KV use over time, one line per replica."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from harness.output.figures import save_figure

BINS = 100


def plot_pools(outcome, path: Path) -> None:
    """Top: the share of each time bin a replica spent computing steps; bottom: its KV cache used."""
    steps = outcome.steps
    end = float((steps["start"] + steps["duration"]).max()) if len(steps) else 1.0
    edges = np.linspace(0.0, max(end, 1e-9), BINS + 1)
    fig = Figure(figsize=(10, 6), layout="constrained")
    busy_ax, kv_ax = fig.subplots(2, 1, sharex=True)
    styles = {"prefill": "-", "decode": "--"}
    for pool, blocks in outcome.pool_blocks.items():
        for index, num_blocks in enumerate(blocks):
            mine = steps[(steps["pool"] == pool) & (steps["replica"] == index)]
            busy, _ = np.histogram(mine["start"], bins=edges, weights=mine["duration"])
            label = f"{pool} {index}"
            centres = (edges[:-1] + edges[1:]) / 2
            busy_ax.plot(centres, 100.0 * np.minimum(busy / np.diff(edges), 1.0), styles[pool], lw=0.9, label=label)
            kv_ax.plot(mine["start"], 100.0 * (1.0 - mine["free_blocks"] / num_blocks), styles[pool], lw=0.8,
                       label=label)
    busy_ax.set_ylabel("busy (% of time)")
    busy_ax.set_ylim(0, 105)
    kv_ax.set_ylabel("KV cache used (%)")
    kv_ax.set_ylim(0, 105)
    kv_ax.set_xlabel("time (s)")
    busy_ax.legend(loc="upper right", fontsize=8, ncol=2)
    for ax in (busy_ax, kv_ax):
        ax.grid(alpha=0.3)
    s = outcome.summary
    fig.suptitle(f"Disaggregated pools: {s.get('model', '?')} on {s.get('hardware', '?')} "
                 f"({s.get('prefill_replicas')}P {s.get('decode_replicas')}D, TP {s.get('tp_sizes', '?')}), "
                 f"{s.get('workload', '?')}", fontsize=10)
    save_figure(fig, path)
