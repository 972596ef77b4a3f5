"""Readable names for summary columns and plot titles: the one mapping every plot uses.

A summary column such as ttft_p90_s is shown as "TTFT P90 (s)"; a plot's title names the model,
the hardware, the workload and the scheduling policy of the runs it shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

IDENTITY = ("model", "hardware", "workload", "policy")  # what a plot title names
_LATENCIES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
_STATS = {"mean": "mean", "p50": "P50", "p90": "P90", "p99": "P99"}
METRIC_LABELS = {
    "input_tok_s": "input throughput (tok/s)",
    "output_tok_s": "output throughput (tok/s)",
    "total_tok_s": "total throughput (tok/s)",
    "request_s": "request throughput (req/s)",
    "makespan_s": "makespan (s)",
    "wall_s": "wall time (s)",
    "num_requests": "requests served (count)",
    "num_rejected": "requests rejected (count)",
    "num_clipped": "requests clipped (count)",
    "num_skipped": "requests skipped (count)",
    "input_tokens": "input tokens (tokens)",
    "output_tokens": "output tokens (tokens)",
    "preemptions": "preemptions (count)",
    "recomputed_tokens": "recomputed tokens (tokens)",
    "cached_tokens": "prefix-cache hit tokens (tokens)",
    "prefix_hit_rate": "prefix-cache hit rate (fraction)",
    "num_blocks": "KV blocks (count)",
    "num_steps": "steps (count)",
    "mean_batch_requests": "mean batch (requests)",
    "capacity_req_s": "capacity (req/s)",
    "rate": "request rate (req/s)",
    **{f"{m}_{s}_s": f"{name} {stat} (s)" for m, name in _LATENCIES.items() for s, stat in _STATS.items()},
}


def metric_label(column: str) -> str:
    """"TTFT P90 (s)" for ttft_p90_s; unknown columns keep their name, with the unit their suffix implies."""
    if column in METRIC_LABELS:
        return METRIC_LABELS[column]
    latency = re.fullmatch(r"(ttft|tpot|e2e)_p([0-9.]+)_s(_at_capacity)?", column)
    if latency:
        return f"{_LATENCIES[latency[1]]} P{latency[2]} (s)"
    for suffix, unit in (("_tok_s", "tok/s"), ("_req_s", "req/s"), ("_s", "s")):
        if column.endswith(suffix):
            return f"{column.removesuffix(suffix).replace('_', ' ')} ({unit})"
    return column.replace("_", " ")


def run_identity(rc: Any) -> dict[str, str]:
    """model, hardware, workload and policy of a RunConfig, as the summary row records them."""
    sim = rc.backend == "sim"
    return {
        "model": getattr(rc.model, "name", "") if sim else Path(rc.engine.model).name,
        "hardware": getattr(rc.hardware, "name", "") if sim else "measured",
        "workload": rc.workload.label,
        "policy": rc.scheduler.policy,
    }


def run_title(row: Mapping[str, Any], prefix: str = "") -> str:
    """"<prefix>: Qwen3-0.6B on H100, workload bench, policy nano" from a summary row."""
    model, hardware, workload, policy = (str(row.get(key, "?")) for key in IDENTITY)
    text = f"{model} on {hardware}, workload {workload}, policy {policy}"
    return f"{prefix}: {text}" if prefix else text


def table_title(table: pd.DataFrame, prefix: str = "") -> str:
    """run_title over many rows: a field that differs between rows reads "(varies)"."""
    row = {}
    for key in IDENTITY:
        values = table[key].dropna().astype(str).unique() if key in table.columns else []
        row[key] = values[0] if len(values) == 1 else "(varies)"
    return run_title(row, prefix)
