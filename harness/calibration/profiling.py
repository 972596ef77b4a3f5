"""Time an executor over a grid of step shapes: the table the profiled cost model is fitted on.

Each shape is a StepPlan built directly (no scheduler, harness.calibration.grid): every scheduled
entry gets blocks of its own in the KV pool (disjoint block tables, as a real batch has) but for
a prefix it shares with others where the shape says so, random token ids, and the workloads'
sampling parameters (temperature 0.6 and a seed per request: seeded rows cost the sampler a
generator each, a host cost a profile without seeds misses). A shape is executed `warmup` times,
then timed `repeats` times (fewer when a shape is slow: at most max_seconds_per_shape once min_repeats are in); the row
holds sim.features.step_features of the plan and the mean of the executor's own reported
durations (EngineExecutor synchronises, so that is the step's time on the device), repeats more
than STALL x the median left out. An executor that overlaps steps (async scheduling) is timed as
it serves: each repeat is submitted before the previous one's result is read, and its duration is
its span on the device (engine.overlap), so host work it hides is not counted; such rows also
carry launch_s (host time of submit()) and gpu_s (the span with the device held busy until the
step was fully queued: its device time alone) and lead_s (the time from submit() on an idle device
until the device finished the step, less gpu_s), from which sim.profiled prices how much of a
launch-bound step (an eager prefill) the step before it hides, and what a step after an idle gap
pays.

Shapes: prefill steps (total new tokens x sequences x cached context per sequence), decode steps
(batch x mean context, contexts spread over [mean/2, 3 mean/2]), mixed steps (one prefill chunk
beside decodes), long single chunks after long cached contexts (eager and as graphs: the grid's
long_prefill fields), steps whose sequences share a prefix's blocks (decode batches, prefill
chunks after a cache hit, mixed steps: the grid's shared_* fields), each decode shape also with
CUDA graphs bypassed (eager) where the executor captured graphs, and `num_random` (+
`num_random_shared`) random shapes (ragged lengths, any batch) that the fit never sees: the
held-out set of different shapes. Shapes that exceed the scheduler's budgets or the KV pool are
skipped: a real run cannot produce them either.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.core.config import SchedulerConfig
from engine.core.executor import Executor
from engine.core.plan import StepPlan
from harness.calibration.expert_steps import ExpertTally
from harness.calibration.grid import DECODE_KINDS, LONG_PREFILL, ProfileGrid, build_plan
from sim.features import ROUTING_GROUPS, routing_sequences, step_features

__all__ = ["LONG_PREFILL", "ExpertTally", "OverlappedTiming", "ProfileGrid", "build_plan", "profile_executor",
           "time_plan", "time_plan_overlapped"]

STALL = 3.0


def time_plan(executor: Executor, plan: StepPlan, grid: ProfileGrid) -> list[float]:
    for _ in range(grid.warmup):
        executor.execute(plan)
    durations: list[float] = []
    started = time.perf_counter()
    while len(durations) < grid.repeats:
        durations.append(executor.execute(plan).duration_s)
        if len(durations) >= grid.min_repeats and time.perf_counter() - started > grid.max_seconds_per_shape:
            break
    return durations


@dataclass
class OverlappedTiming:
    durations: list[float]  # spans of repeats submitted back to back
    launch_s: float  # mean host time of one submit(): building, uploading and launching the step
    gpu_s: float | None  # mean span with the device held busy until every launch was queued
    lead_s: float | None = None  # submit() on an idle device until the device is done, less gpu_s


def time_plan_overlapped(executor: Executor, plan: StepPlan, grid: ProfileGrid) -> OverlappedTiming:
    """Time a shape as an overlapping executor serves it: each repeat submitted before the
    previous one's result is read. Also what decides how much of a step the previous one hides
    (sim.profiled): the host time of submit() and, where the executor can hold its device
    (hold_device() returns True), the device time alone and the lead."""
    for _ in range(grid.warmup):
        executor.execute(plan)
    durations: list[float] = []
    launches: list[float] = []
    started = time.perf_counter()

    def submit():
        t = time.perf_counter()
        pending = executor.submit(plan)
        launches.append(time.perf_counter() - t)
        return pending

    pending = submit()
    while len(durations) < grid.repeats:
        last = len(durations) + 1 >= grid.repeats
        following = None if last else submit()
        durations.append(pending.result().duration_s)
        pending = following
        if len(durations) >= grid.min_repeats and time.perf_counter() - started > grid.max_seconds_per_shape:
            break
    if pending is not None:
        pending.result()  # the device must be done with it before the next shape's blocks are reused
    launch = statistics.median(launches)
    gpu = None
    # the hold must outlast the launches, so that the step's work queues up behind it
    if executor.hold_device(2 * launch + 0.005):
        spans = [executor.submit(plan).result().duration_s]
        executor.hold_device(2 * launch + 0.005)
        spans.append(executor.submit(plan).result().duration_s)
        gpu = min(spans)
        lead = max(0.0, statistics.median(_end_from_idle(executor, plan) for _ in range(3)) - gpu)
        return OverlappedTiming(durations, launch, gpu, lead)
    return OverlappedTiming(durations, launch, gpu)


def _end_from_idle(executor: Executor, plan: StepPlan) -> float:
    """Wall time from submit() on an idle device until the device finished the step: what a step
    after an idle gap costs a served run's clock. The tokens reach the host a little later (the
    wait's wake-up and the copy out: ready_age_s), which a served run does not count: it stamps
    a token when the device is done."""
    started = time.perf_counter()
    result = executor.submit(plan).result()
    return time.perf_counter() - started - result.ready_age_s


def profile_executor(executor: Executor, sched: SchedulerConfig, grid: ProfileGrid, progress=None,
                     experts: ExpertTally | None = None) -> pd.DataFrame:
    """One row per timed shape: step features, duration_s (mean of the repeats, stalls left out) and
    how it was measured. Decode shapes also run with use_cuda_graphs off where the executor replays
    decode graphs (info().graph_sizes), so the table holds eager decode steps too. experts: an MoE
    engine's tally (harness.calibration.expert_steps): each row gets moe_distinct_experts, the
    distinct experts per MoE layer its step's tokens touched."""
    rng = np.random.default_rng(grid.seed)
    info = executor.info()
    spec = info.kv_cache_spec
    rows = []
    for shape_set, kind, entries in list(grid.shapes(sched, rng, spec)):
        plan = build_plan(entries, spec, sched, rng, info.vocab_size)
        if plan is None:
            continue
        plans = [plan]
        if kind in DECODE_KINDS and info.graph_sizes.decode and (
                shape_set == "random" or len(entries) in grid.eager_decode_batches):
            plans.append(dataclasses.replace(plan, use_cuda_graphs=False))
        if kind == LONG_PREFILL and step_features(plan, info.graph_sizes)["cuda_graph"]:
            plans.append(dataclasses.replace(plan, use_cuda_graphs=False))
        for timed in plans:
            if experts is not None:
                experts.begin()
            rows.append(_profile_row(executor, timed, grid, info.overlaps_steps, info.graph_sizes, shape_set, kind))
            if experts is not None:
                rows[-1]["moe_distinct_experts"] = experts.distinct()
                rows[-1][ROUTING_GROUPS] = len(routing_sequences(timed))
            if progress is not None:
                progress(len(rows), rows[-1])
    return pd.DataFrame(rows)


def _profile_row(executor: Executor, plan: StepPlan, grid: ProfileGrid, overlapped: bool, graphs,
                 shape_set: str, kind: str) -> dict:
    extra = {}
    if overlapped:
        timing = time_plan_overlapped(executor, plan, grid)
        durations = timing.durations
        extra = {"launch_s": timing.launch_s, "gpu_s": timing.gpu_s, "lead_s": timing.lead_s}
    else:
        durations = time_plan(executor, plan, grid)
    row = step_features(plan, graphs)
    median = statistics.median(durations)
    # The mean, as the clock sums step times (host-bound steps vary a lot between repeats);
    # a repeat beyond STALL x the median is a collector pause, not the shape's cost.
    kept = [d for d in durations if d <= STALL * median]
    row.update(set=shape_set, kind=kind, duration_s=sum(kept) / len(kept), duration_median_s=median,
               duration_min_s=min(durations), duration_max_s=max(durations), repeats=len(durations), **extra)
    return row
