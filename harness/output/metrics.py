"""A run's result as pandas tables: one row per request, one per step, one summary row.

Times are seconds on the run's clock (simulated or wall), measured from the start of the run.
TTFT = first_token - arrival; TPOT = (finish - first_token) / (output_tokens - 1), undefined for
one-token outputs; E2E = finish - arrival. Throughputs are token counts over the makespan (the
clock when the last request finished).
"""

from __future__ import annotations

from array import array
from operator import attrgetter
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.launch_log import LAUNCH_COLUMNS
from engine.core.loop import RunResult
from engine.core.records import RequestRecords, StepTotals
from engine.core.step_log import StepLog, StepRecord, StepRun
from harness.output.summary import RunLabels, RunSummary

PERCENTILES = (50, 90, 99)  # RunSummary has a field for each
# Per-step tables run to hundreds of MB on a whole trace: written gzipped (pandas reads them as
# they are); requests.csv and summary.csv stay plain.
STEPS_FILE = "steps.csv.gz"
LEGACY_STEPS_FILE = "steps.csv"
STEPS_COMPRESSION = {"method": "gzip", "compresslevel": 3, "mtime": 0}  # mtime 0: same table, same bytes

REQUEST_COLUMNS = (
    "request_id", "arrival", "first_scheduled", "first_token", "finish", "ttft", "tpot", "e2e",
    "prompt_tokens", "output_tokens", "preemptions", "cached_tokens", "recomputed_tokens", "finish_reason",
)
STEP_COLUMNS = (
    "step", "start", "duration", "kind", "requests", "prefill_tokens", "decode_tokens", "waiting", "running",
    "free_blocks", "preempted", "prefix_hit_tokens", "repeated_kv_tokens",
)


def requests_frame(result: RunResult) -> pd.DataFrame:
    if result.records is not None:
        return _records_frame(result.records)
    reqs = result.requests
    frame = pd.DataFrame({
        "request_id": [r.request_id for r in reqs],
        "arrival": np.array([r.arrival_time for r in reqs], dtype=float),
        "first_scheduled": np.array([_nan(r.first_scheduled_time) for r in reqs], dtype=float),
        "first_token": np.array([_nan(r.first_token_time) for r in reqs], dtype=float),
        "finish": np.array([_nan(r.finish_time) for r in reqs], dtype=float),
        "prompt_tokens": np.array([r.num_prompt_tokens for r in reqs], dtype=np.int64),
        "output_tokens": np.array([r.num_output_tokens for r in reqs], dtype=np.int64),
        "preemptions": np.array([r.num_preemptions for r in reqs], dtype=np.int64),
        "cached_tokens": np.array([r.num_cached_tokens for r in reqs], dtype=np.int64),
        "recomputed_tokens": np.array([r.num_recomputed_tokens for r in reqs], dtype=np.int64),
        "finish_reason": [r.finish_reason.value if r.finish_reason else "" for r in reqs],
    })
    return _with_latencies(frame)


def _records_frame(records: RequestRecords) -> pd.DataFrame:
    """requests_frame of a compact run: the records in submission order."""
    order = np.argsort(np.frombuffer(records.order, dtype=np.int64), kind="stable")
    columns = {name: np.frombuffer(getattr(records, name), dtype=np.int64 if getattr(records, name).typecode == "q"
                                   else float)[order]
               for name in ("arrival", "first_scheduled", "first_token", "finish", "prompt_tokens", "output_tokens",
                            "preemptions", "cached_tokens", "recomputed_tokens")}
    ids, reasons = records.request_id, records.finish_reason
    frame = pd.DataFrame({"request_id": [ids[i] for i in order.tolist()], **columns,
                          "finish_reason": [reasons[i] for i in order.tolist()]})
    return _with_latencies(frame)


def _with_latencies(frame: pd.DataFrame) -> pd.DataFrame:
    frame["ttft"] = frame["first_token"] - frame["arrival"]
    decode_steps = (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    frame["tpot"] = (frame["finish"] - frame["first_token"]) / decode_steps
    frame["e2e"] = frame["finish"] - frame["arrival"]
    return frame[list(REQUEST_COLUMNS)]


# column -> (read from the StepRecord or from its StepStats, attribute, dtype; None: Python objects)
_STEP_SOURCES = {
    "step": ("stats", "step", np.int64), "start": ("record", "start_s", float),
    "duration": ("record", "duration_s", float), "kind": ("stats", "kind", None),
    "requests": ("stats", "num_requests", np.int64), "prefill_tokens": ("stats", "num_prefill_tokens", np.int64),
    "decode_tokens": ("stats", "num_decode_tokens", np.int64), "waiting": ("stats", "num_waiting", np.int64),
    "running": ("stats", "num_running", np.int64), "free_blocks": ("stats", "num_free_blocks", np.int64),
    "preempted": ("stats", "num_preempted", np.int64), "prefix_hit_tokens": ("stats", "prefix_hit_tokens", np.int64),
    "repeated_kv_tokens": ("stats", "repeated_kv_tokens", np.int64),
}
SUMMARY_STEP_COLUMNS = ("prefill_tokens", "requests")  # what summarize() reads of a step table


def steps_frame(result: RunResult, columns: tuple[str, ...] = STEP_COLUMNS) -> pd.DataFrame:
    """The step table, one row per step (a run of steps booked at once included: a StepRun, read
    without making a record per step), or only the named columns of it (a whole trace has 10^5
    steps and more); no rows when the run kept only its step totals."""
    steps = result.steps if isinstance(result.steps, StepLog) else StepLog(result.steps)
    items = steps.items
    if not steps.num_runs:  # records only
        rows = {"record": items, "stats": list(map(attrgetter("stats"), items))}
        table = {}
        for column in columns:
            source, name, dtype = _STEP_SOURCES[column]
            values = map(attrgetter(name), rows[source])
            table[column] = list(values) if dtype is None else np.fromiter(values, dtype=dtype, count=len(items))
    else:
        layout = _RunLayout(items)
        table = {column: layout.column(*_STEP_SOURCES[column]) for column in columns}
    return pd.DataFrame(table, index=pd.RangeIndex(len(steps)), columns=list(columns))


def with_launches(steps: pd.DataFrame, result: RunResult) -> pd.DataFrame:
    """steps (a steps_frame of result, with its step column) with the LaunchRows an engine fleet
    replica kept (engine.core.launch_log), joined by step: launch_s NaN and the decode graph
    features 0 where a step has none (it did not overlap); steps as they are where the replica
    kept no LaunchLog (a simulated one) or the table has no step column."""
    if result.launches is None or "step" not in steps.columns:
        return steps
    rows = pd.DataFrame(result.launches, columns=list(LAUNCH_COLUMNS)).drop_duplicates("step", keep="last")
    joined = steps.merge(rows, on="step", how="left", validate="many_to_one")
    features = [c for c in LAUNCH_COLUMNS if c not in ("step", "launch_s")]
    joined[features] = joined[features].fillna(0).astype(np.int64)
    joined["launch_s"] = joined["launch_s"].astype(float)
    joined.index = steps.index
    return joined


class _RunLayout:
    """Where each step of a StepLog with runs comes from: per item its step count, whether it is a
    run, and its stats (a run's values repeat over its steps; step, start, duration and free
    blocks are the run's per step)."""

    _PER_STEP = {"start_s": "starts", "duration_s": "durations", "num_free_blocks": "free_blocks"}

    def __init__(self, items: list[StepRecord | StepRun]) -> None:
        self.items = items
        self.is_run = is_run = [isinstance(r, StepRun) for r in items]
        self.counts = np.array([r.num_steps if run else 1 for r, run in zip(items, is_run)], dtype=np.int64)
        self.in_run = np.repeat(np.array(is_run, dtype=bool), self.counts)
        self.stats = [r.stats for r in items]
        self.runs = [r for r, run in zip(items, is_run) if run]

    def column(self, source: str, name: str, dtype: type | None) -> np.ndarray | list:
        items, counts = self.items, self.counts
        if source == "record":
            read = attrgetter(name)
            firsts = [0.0 if run else read(r) for r, run in zip(items, self.is_run)]
        else:
            firsts = list(map(attrgetter(name), self.stats))
        if dtype is None:  # Python objects (kind), each repeated over its run's steps
            values: list = np.repeat(np.array(firsts, dtype=object), counts).tolist()
            return values
        out = np.repeat(np.array(firsts, dtype=dtype), counts)
        if name == "step":  # counts up by one within a run
            offsets = np.cumsum(counts) - counts
            out += np.arange(len(out), dtype=np.int64) - np.repeat(offsets, counts)
        elif name in self._PER_STEP:
            attr = self._PER_STEP[name]
            joined = array("q" if attr == "free_blocks" else "d")
            for run in self.runs:  # (array += array copies memory; numpy's concatenate converts each run)
                joined += getattr(run, attr)
            out[self.in_run] = np.frombuffer(joined, dtype=joined.typecode)
        return out


def write_steps(steps: pd.DataFrame, folder: Path) -> Path:
    path = Path(folder) / STEPS_FILE
    steps.to_csv(path, index=False, compression=STEPS_COMPRESSION)
    return path


def steps_path(folder: Path) -> Path:
    """A run folder's per-step table: steps.csv.gz, or steps.csv from runs written before it was compressed."""
    folder = Path(folder)
    for name in (STEPS_FILE, LEGACY_STEPS_FILE):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder} has no {STEPS_FILE} (the run was written with output.steps=none?)")


def read_steps(folder: Path) -> pd.DataFrame:
    return pd.read_csv(steps_path(folder))


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, makespan_s: float, num_blocks: int,
              labels: RunLabels | None = None, totals: StepTotals | None = None) -> RunSummary:
    """The summary row: throughput over the makespan, latency percentiles, cache behaviour;
    totals (a run that kept no steps) stand for the step table."""
    span = makespan_s if makespan_s > 0 else float("nan")
    input_tokens = int(requests["prompt_tokens"].sum())
    output_tokens = int(requests["output_tokens"].sum())
    latency = {}
    for metric in ("ttft", "tpot", "e2e"):
        latency[f"{metric}_mean_s"] = float(requests[metric].mean())  # NaN when no request has the metric
        for p in PERCENTILES:
            latency[f"{metric}_p{p}_s"] = percentile(requests, metric, p)
    cached = int(requests["cached_tokens"].sum())
    if totals is None:
        num_steps, computed_prefill = len(steps), int(steps["prefill_tokens"].sum())
        mean_batch = float(steps["requests"].mean()) if len(steps) else 0.0
    else:  # the same sum over the same integers, and the mean pandas takes (float sum / count)
        num_steps, computed_prefill = totals.count, totals.prefill_tokens
        mean_batch = float(totals.requests) / totals.count if totals.count else 0.0
    return RunSummary(
        num_requests=len(requests),
        makespan_s=makespan_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        input_tok_s=input_tokens / span,
        output_tok_s=output_tokens / span,
        total_tok_s=(input_tokens + output_tokens) / span,
        request_s=len(requests) / span,
        **latency,
        preemptions=int(requests["preemptions"].sum()),
        recomputed_tokens=int(requests["recomputed_tokens"].sum()),
        cached_tokens=cached,
        # Of the tokens that needed KV at admission, the share the prefix cache supplied.
        prefix_hit_rate=cached / (cached + computed_prefill) if cached + computed_prefill else 0.0,
        num_blocks=num_blocks,
        num_steps=num_steps,
        mean_batch_requests=mean_batch,
        labels=labels,
    )


def percentile(requests: pd.DataFrame, metric: str, p: float) -> float:
    values = requests[metric].dropna().to_numpy()
    return float(np.percentile(values, p)) if len(values) else float("nan")


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
