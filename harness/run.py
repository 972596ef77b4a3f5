"""One run: build the executor, the scheduler and the requests, drive the core loop, tabulate.

The simulator runs on a SimulatedClock (time jumps by each step's priced duration), the engine on
a WallClock (measured time). Outputs go to a directory: requests.csv, steps.csv.gz (unless
output.steps=none), summary.csv and, unless disabled, timeline.png and latency_cdf.png. Engine runs
(and runs asked to record) also carry each step's features, schedule fingerprint and host time in
the step table (harness.output.recording). An engine run with backend.record_expert_counts also
writes expert_counts.csv (tokens routed per MoE layer and expert: engine.expert_counts) and logs
the routing skew they give (sim.moe.fit_routing_skew).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from engine.core import Executor, GraphSizes, make_scheduler
from engine.core.loop import SimulatedClock, WallClock, run
from harness.backends import BACKENDS
from harness.config import RunConfig
from harness.convert import ConfigError
from harness.labels import run_identity, run_title
from harness.output.metrics import requests_frame, steps_frame, summarize, write_steps
from harness.output.recording import StepRecorder
from harness.output.summary import FitCounts, RunLabels, RunSummary
from harness.run_folder import staged
from harness.workloads import build_workload

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: RunSummary
    num_blocks: int
    rejected: dict[str, str] = field(default_factory=dict)
    graph_sizes: GraphSizes = GraphSizes()  # the CUDA graphs the backend ran with
    # tokens routed per MoE layer and expert (backend.record_expert_counts; engine.expert_counts)
    expert_counts: pd.DataFrame | None = None


def make_executor(rc: RunConfig) -> Executor:
    """The executor of the backend rc names (harness.backends)."""
    return BACKENDS.get(rc.backend)(rc)


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector off while a simulation runs, as it was after.

    NOTE: a simulated run keeps every request's tokens and a record per step alive, so each
    collection rescans a heap that only grows (about a tenth of a deployment evaluation's time),
    and it frees nothing: the loop makes no reference cycles (reference counting frees its garbage;
    tests/harness/test_plan_pinned.py checks a run leaves no cycles behind). The objects made
    while it was off are all young to the collector: the first collection after would rescan every
    one of them (a few percent of a short run), so they are moved to the oldest generation first
    (gc.freeze then gc.unfreeze: two list splices), unless someone else froze objects.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _configured_executor(rc: RunConfig) -> Executor:
    try:
        return make_executor(rc)
    except (ValueError, TypeError) as error:
        # The backend rejected the configuration (model does not fit, missing checkpoint, ...).
        raise ConfigError(f"backend={rc.backend}: {error}") from None


def run_once(rc: RunConfig, progress: bool = True, executor: Executor | None = None, label: str = "",
             record: bool | None = None, keep_steps: bool = True) -> RunOutcome:
    """Serve rc.workload to completion; executor overrides the configured backend (tests).
    record: add step features, schedule hashes (and host times) to steps; None: engine runs only.
    Requests are made as they arrive and kept as records once served; keep_steps=False (nothing
    reads the step table: output.steps=none, no plots) keeps only the totals the summary needs,
    and an empty step table."""
    stop_recording = None
    if executor is None:
        executor = _configured_executor(rc)
    try:
        info = executor.info()
        workload = build_workload(rc.workload, rc.scheduler.max_model_len, info.vocab_size)
        scheduler = make_scheduler(rc.scheduler, info, rc.cache)
        wall = rc.backend == "engine"
        clock = WallClock() if wall else SimulatedClock()
        recorder = StepRecorder(info.graph_sizes, wall) if (wall if record is None else record) else None
        if recorder is not None:
            # a shared engine serves many runs: this run's recorder must not watch the next ones
            stop_recording = executor.observe(recorder)
        total = len(workload)
        keep_steps = keep_steps or recorder is not None
        bar = tqdm(total=total, desc=label or rc.workload.label, unit="req", disable=not progress,
                   mininterval=0.5, leave=False, dynamic_ncols=True)

        def on_step(record, finished) -> None:
            if finished:
                bar.update(len(finished))

        take_counts = getattr(executor, "take_expert_counts", None)
        if take_counts is not None:
            take_counts()  # what warm-up and profiling steps routed is not this run's
        started = time.perf_counter()
        if recorder is not None:
            clock = recorder.watch(clock)
        bm = scheduler.block_manager
        # the simulator's requests hold their ids packed (no int object per token: docs/fast_forward.md)
        requests = workload.stream(bm.block_size if bm.enable_prefix_caching else None, packed=not wall)
        with bar, nullcontext() if wall else cyclic_gc_paused():
            result = run(scheduler, executor, requests, clock, on_step if progress else None,
                         compact=True, keep_steps=keep_steps)
        wall_s = time.perf_counter() - started
        counts = take_counts() if take_counts is not None else None
    finally:
        if stop_recording is not None:
            stop_recording()
        executor.shutdown()
    return _outcome(rc, result, recorder, workload, info, total, wall_s, counts)


def _outcome(rc: RunConfig, result, recorder: StepRecorder | None, workload, info, total: int, wall_s: float,
             counts) -> RunOutcome:
    """A finished run's tables and summary."""
    if result.rejected:
        first = next(iter(result.rejected.items()))
        log.warning("%d of %d requests were rejected at admission, e.g. %s: %s",
                    len(result.rejected), total, *first)
    requests = requests_frame(result)
    steps = steps_frame(result)
    if recorder is not None:
        steps = pd.concat([steps, recorder.frame()], axis=1)
    labels = RunLabels(backend=rc.backend, **run_identity(rc), num_submitted=total,
                       num_rejected=len(result.rejected), fit=FitCounts(**workload.fit_counts()), wall_s=wall_s)
    summary = summarize(requests, steps, result.makespan_s, info.num_blocks, labels, result.step_totals)
    return RunOutcome(requests, steps, summary, info.num_blocks, dict(result.rejected), info.graph_sizes,
                      _counts_frame(counts, rc))


def _counts_frame(counts, rc: RunConfig) -> pd.DataFrame | None:
    """The run's routed tokens per layer and expert, and the routing skew they give (logged)."""
    if counts is None:
        return None
    from sim.moe import fit_routing_skew

    if counts.tokens.sum() > 0:
        log.info("routing skew fitted to the engine's expert counts: %.3f (backend.moe_routing_skew)",
                 fit_routing_skew(counts.tokens, rc.model.num_experts_per_tok))
    return counts.frame()


def write_tables(requests: pd.DataFrame, steps: pd.DataFrame, summary: RunSummary, rejected: dict[str, str],
                 out_dir: Path, steps_mode: str = "full") -> None:
    """requests.csv, steps.csv.gz (unless steps_mode is "none"), summary.csv and rejected.csv, each
    under its name only once complete (summary.csv last: harness.run_folder.staged)."""
    with staged(out_dir) as staging:
        _write_tables(requests, steps, summary, rejected, staging, steps_mode)


def _write_tables(requests: pd.DataFrame, steps: pd.DataFrame, summary: RunSummary, rejected: dict[str, str],
                  folder: Path, steps_mode: str) -> None:
    requests.to_csv(folder / "requests.csv", index=False)
    if steps_mode == "full":
        write_steps(steps, folder)
    pd.DataFrame([summary.to_row()]).to_csv(folder / "summary.csv", index=False)
    if rejected:
        pd.DataFrame({"request_id": list(rejected), "error": list(rejected.values())}).to_csv(
            folder / "rejected.csv", index=False)


def write_outcome(outcome: RunOutcome, out_dir: Path, plots: bool = True, steps: str = "full") -> None:
    """The run's tables (and plots) in out_dir; steps="none" leaves the per-step table out. Files
    appear in out_dir only once all of them are written (an interrupted run leaves none)."""
    with staged(out_dir) as staging:
        _write_tables(outcome.requests, outcome.steps, outcome.summary, outcome.rejected, staging, steps)
        if outcome.expert_counts is not None:
            outcome.expert_counts.to_csv(staging / "expert_counts.csv", index=False)
        if plots:
            from harness.output.plots import plot_latency_cdfs, plot_timeline

            plot_timeline(outcome.steps, outcome.num_blocks, staging / "timeline.png", outcome.summary)
            plot_latency_cdfs(outcome.requests, staging / "latency_cdf.png", run_title(outcome.summary))


def require_served(outcome, label: str = "") -> None:
    """A run (a RunOutcome, or a fleet's FleetOutcome) that served no request has no metrics to
    report: a ConfigError saying why."""
    summary = outcome.summary
    if summary.num_requests:
        return
    where = f"{label}: " if label else ""
    if outcome.rejected:
        rid, error = next(iter(outcome.rejected.items()))
        raise ConfigError(f"{where}nothing was served: all {summary.labels.num_submitted} requests were rejected at "
                          f"admission (e.g. request {rid}: {error}); see rejected.csv")
    raise ConfigError(f"{where}nothing was served: the workload has no request left to serve "
                      f"({summary.labels.fit.num_skipped} skipped by workload.oversize=skip as longer than "
                      "scheduler.max_model_len)")
