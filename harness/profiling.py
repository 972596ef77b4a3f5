"""Time an executor over a grid of step shapes: the table the profiled cost model is fitted on.

Each shape is a StepPlan built directly (no scheduler): every scheduled entry gets blocks of its
own in the KV pool (disjoint block tables, as a real batch has), random token ids, and the
workloads' sampling parameters (temperature 0.6 and a seed per request: seeded rows cost the
sampler a generator each, a host cost a profile without seeds misses). A shape is executed `warmup` times, then timed `repeats` times
(fewer when a shape is slow: at most max_seconds_per_shape once min_repeats are in); the row
holds sim.features.step_features of the plan and the mean of the executor's own reported
durations (EngineExecutor synchronises, so that is the step's time on the device), repeats more
than STALL x the median left out. An executor that overlaps steps (async scheduling) is timed as
it serves: each repeat is submitted before the previous one's result is read, and its duration is
its span on the device (engine.overlap), so host work it hides is not counted; such rows also
carry launch_s (host time of submit()) and gpu_s (the span with the device held busy until the
step was fully queued: its device time alone), from which sim.profiled prices how much of a
launch-bound step (an eager prefill) the step before it hides.

Shapes: prefill steps (total new tokens x sequences x cached context per sequence), decode steps
(batch x mean context, contexts spread over [mean/2, 3 mean/2]), mixed steps (one prefill chunk
beside decodes), long single chunks after long cached contexts (eager and as graphs: the grid's
long_prefill fields), each decode shape also with CUDA graphs bypassed (eager) where the executor
captured graphs, and `num_random` random shapes (ragged lengths, any batch) that the fit never
sees: the held-out set of different shapes. Shapes that exceed the scheduler's budgets or the KV
pool are skipped: a real run cannot produce them either.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from engine.core.config import SchedulerConfig
from engine.core.executor import Executor
from engine.core.plan import KVCacheSpec, ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams
from sim.features import step_features

TEMPERATURE = 0.6  # the workloads' default; like theirs, every request carries its own seed
MAX_TOKEN_ID = 10000
STALL = 3.0

LONG_PREFILL = "long_prefill"  # shapes profiled eagerly besides as graphs (ProfileGrid.long_prefill_tokens)
Entry = tuple[int, int, bool]  # (new tokens, cached tokens before them, is_decode)


@dataclass(frozen=True)
class ProfileGrid:
    prefill_tokens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
    prefill_seqs: tuple[int, ...] = (1, 4, 16, 32)
    prefill_contexts: tuple[int, ...] = (0, 512, 2048)
    min_chunk: int = 8  # prefill chunks shorter than this are not profiled (T / seqs)
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)
    decode_contexts: tuple[int, ...] = (128, 512, 1024, 2048, 3072)
    eager_decode_batches: tuple[int, ...] = (1, 8, 32, 64, 128, 256, 512)
    mixed_prefill_tokens: tuple[int, ...] = (64, 512, 2048, 8192)
    mixed_decodes: tuple[int, ...] = (8, 64, 256)
    mixed_context: int = 1024
    # Long prompts: one chunk of each size after each cached context, profiled eagerly as well
    # as replayed where it fits a prefill graph. Past the graph limit a served prompt runs eagerly,
    # and a prompt longer than max_num_batched_tokens is served in chunks at growing offsets, whose
    # attention grows with the context (c * (o + c/2) pairs); without these rows the eager fit
    # extrapolates from a few multi-sequence steps (a 4,808-token prompt priced 17 ms, took 32 ms:
    # issue 14). Shapes past max_model_len are skipped: profile with max_model_len >= 16k for them.
    long_prefill_tokens: tuple[int, ...] = (1024, 2048, 3072, 4096, 5120, 6144, 8192)
    long_prefill_contexts: tuple[int, ...] = (0, 4096, 8192, 12288)
    num_random: int = 60
    warmup: int = 1  # the first execution of a shape compiles any new kernel specialisation
    repeats: int = 5
    min_repeats: int = 3
    max_seconds_per_shape: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("warmup", "num_random", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"ProfileGrid.{name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.min_repeats <= self.repeats:
            raise ValueError(f"ProfileGrid needs 1 <= min_repeats <= repeats, got {self.min_repeats}, {self.repeats}")

    @classmethod
    def quick(cls) -> ProfileGrid:
        """A small grid for CPU runs and tests (seconds on the tiny model)."""
        return cls(prefill_tokens=(16, 64, 256, 1024), prefill_seqs=(1, 4), prefill_contexts=(0, 64),
                   decode_batches=(1, 4, 16, 32), decode_contexts=(32, 256), eager_decode_batches=(1, 16),
                   mixed_prefill_tokens=(32, 128), mixed_decodes=(4,), mixed_context=64,
                   long_prefill_tokens=(128, 384), long_prefill_contexts=(0, 128), num_random=8,
                   warmup=1, repeats=3, min_repeats=2, max_seconds_per_shape=0.2)

    def shapes(self, sched: SchedulerConfig, rng: np.random.Generator,
               kv: KVCacheSpec | None = None) -> Iterator[tuple[str, str, list[Entry]]]:
        """(set, kind, entries): set "grid" or "random"; kind prefill, decode or mixed. kv: random
        decode batches draw contexts that fit this pool (grid shapes that do not fit are skipped)."""
        top = sched.max_model_len - 2  # room for the new token and the one sampled after it
        for tokens in self.prefill_tokens:
            for seqs in self.prefill_seqs:
                n = tokens // seqs
                for cached in self.prefill_contexts:
                    if n >= self.min_chunk and cached + n <= top:
                        yield "grid", "prefill", [(n, cached, False)] * seqs
        for batch in self.decode_batches:
            for context in self.decode_contexts:
                yield "grid", "decode", [(1, c, True) for c in _spread(rng, context, batch, top)]
        for tokens in self.mixed_prefill_tokens:
            for decodes in self.mixed_decodes:
                if tokens <= top:
                    yield "grid", "mixed", [(tokens, 0, False)] + [
                        (1, c, True) for c in _spread(rng, self.mixed_context, decodes, top)]
        for tokens in self.long_prefill_tokens:
            for cached in self.long_prefill_contexts:
                if cached + tokens <= top:
                    yield "grid", LONG_PREFILL, [(tokens, cached, False)]
        budget = sched.max_num_batched_tokens
        for _ in range(self.num_random):
            kind = ("prefill", "decode", "mixed")[int(rng.integers(3))]
            entries: list[Entry] = []
            if kind == "decode":
                batch = int(rng.integers(1, sched.max_num_seqs + 1))
                longest = top if kv is None else min(top, (kv.num_blocks // batch) * kv.block_size - 1)
                if longest <= 16:
                    continue
                entries += [(1, int(c), True) for c in rng.integers(16, longest, size=batch)]
            elif kind == "mixed":  # decodes as the grid's mixed steps have them, in number and context
                batch = int(rng.integers(1, max(self.mixed_decodes, default=1) + 1))
                entries += [(1, c, True) for c in _spread(rng, self.mixed_context, batch, top)]
            chunks = int(rng.integers(1, 33)) if kind == "prefill" else (1 if kind == "mixed" else 0)
            room = budget - len(entries)
            for _ in range(chunks):
                n = int(rng.integers(self.min_chunk, min(budget, top) // (4 if kind == "prefill" else 2) + 1))
                if n > room:
                    break
                room -= n
                cached = int(rng.integers(0, top - n + 1)) if rng.random() < 0.3 else 0
                entries.insert(0, (n, cached, False))
            if entries:
                yield "random", kind, entries


def _spread(rng: np.random.Generator, mean: int, count: int, top: int) -> list[int]:
    return [int(c) for c in np.clip(rng.integers(mean // 2, mean * 3 // 2 + 1, size=count), 1, top)]


def build_plan(entries: list[Entry], spec: KVCacheSpec, sched: SchedulerConfig,
               rng: np.random.Generator, vocab_size: int) -> StepPlan | None:
    """A step of these entries with disjoint block tables; None if it exceeds a budget or the pool."""
    prefill = sum(n for n, _, d in entries if not d)
    decodes = sum(1 for _, _, d in entries if d)
    if not entries or len(entries) > sched.max_num_seqs or prefill + decodes > sched.max_num_batched_tokens:
        return None
    bs = spec.block_size
    next_block = 0
    scheduled = []
    for i, (n, cached, is_decode) in enumerate(entries):
        need = -(-(cached + n) // bs)
        if next_block + need > spec.num_blocks:
            return None
        table = list(range(next_block, next_block + need))
        next_block += need
        tokens = rng.integers(0, min(vocab_size, MAX_TOKEN_ID), size=n).tolist()
        params = SamplingParams(temperature=TEMPERATURE, ignore_eos=True, seed=int(rng.integers(2**62)))
        scheduled.append(ScheduledRequest(f"profile-{i}", tokens, cached, table, True, params,
                                          1 if is_decode else 0, is_decode))
    kind = "mixed" if prefill and decodes else ("prefill" if prefill else "decode")
    stats = StepStats(0, kind, len(scheduled), prefill, decodes, 0, len(scheduled), spec.num_blocks - next_block, 0, 0)
    return StepPlan(scheduled, stats)


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


def time_plan_overlapped(executor: Executor, plan: StepPlan, grid: ProfileGrid) -> OverlappedTiming:
    """Time a shape as an overlapping executor serves it: each repeat submitted before the
    previous one's result is read. Also the two things that decide how much of a launch-bound
    step the previous step hides (sim.profiled): the host time of submit() and, where the
    executor can hold its device (hold_device() returns True), the device time alone."""
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
    return OverlappedTiming(durations, launch, gpu)


def profile_executor(executor: Executor, sched: SchedulerConfig, grid: ProfileGrid, progress=None) -> pd.DataFrame:
    """One row per timed shape: step features, duration_s (mean of the repeats, stalls left out) and
    how it was measured. Decode shapes also run with use_cuda_graphs off where the executor replays
    decode graphs (info().graph_sizes), so the table holds eager decode steps too."""
    rng = np.random.default_rng(grid.seed)
    info = executor.info()
    spec = info.kv_cache_spec
    rows = []
    for shape_set, kind, entries in list(grid.shapes(sched, rng, spec)):
        plan = build_plan(entries, spec, sched, rng, info.vocab_size)
        if plan is None:
            continue
        plans = [plan]
        if kind == "decode" and info.graph_sizes.decode and (
                shape_set == "random" or len(entries) in grid.eager_decode_batches):
            plans.append(dataclasses.replace(plan, use_cuda_graphs=False))
        if kind == LONG_PREFILL and step_features(plan, info.graph_sizes)["cuda_graph"]:
            plans.append(dataclasses.replace(plan, use_cuda_graphs=False))
        for timed in plans:
            rows.append(_profile_row(executor, timed, grid, info.overlaps_steps, info.graph_sizes, shape_set, kind))
            if progress is not None:
                progress(len(rows), rows[-1])
    return pd.DataFrame(rows)


def _profile_row(executor: Executor, plan: StepPlan, grid: ProfileGrid, overlapped: bool, graphs,
                 shape_set: str, kind: str) -> dict:
    extra = {}
    if overlapped:
        timing = time_plan_overlapped(executor, plan, grid)
        durations = timing.durations
        extra = {"launch_s": timing.launch_s, "gpu_s": timing.gpu_s}
    else:
        durations = time_plan(executor, plan, grid)
    row = step_features(plan, graphs)
    median = statistics.median(durations)
    # The mean, as the clock sums step times (host-bound steps vary a lot between repeats);
    # a repeat beyond STALL x the median is a collector pause, not the shape's cost.
    kept = [d for d in durations if d <= STALL * median]
    row.update(set=shape_set, kind=kind, duration_s=sum(kept) / len(kept), duration_median_s=median, duration_min_s=min(durations),
               duration_max_s=max(durations), repeats=len(durations), **extra)
    return row
