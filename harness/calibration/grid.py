"""The profiling grid: which step shapes harness.calibration.profiling times, built as StepPlans.

Each shape is a list of entries, (new tokens, cached tokens before them, is_decode) and, for a
sequence that shares a prefix, a fourth item (group, prefix tokens): the entries of one group read
the same physical blocks for the first prefix tokens (whole blocks) of their cached context, as
requests do after a prefix-cache hit. Every other block is the entry's own (disjoint tables, as
a real batch has); the plan's StepStats count the repeated reads (engine.core.kv_reads).
Shapes that exceed the scheduler's budgets or the KV pool are skipped: a real run cannot produce
them either.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from engine.core.config import SchedulerConfig
from engine.core.kv_reads import repeated_block_reads
from engine.core.plan import KVCacheSpec, ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams

TEMPERATURE = 0.6  # the workloads' default; like theirs, every request carries its own seed
MAX_TOKEN_ID = 10000

LONG_PREFILL = "long_prefill"  # shapes profiled eagerly besides as graphs (ProfileGrid.long_prefill_tokens)
SHARED_DECODE, SHARED_PREFILL, SHARED_MIXED = "shared_decode", "shared_prefill", "shared_mixed"
SHARED_KINDS = (SHARED_DECODE, SHARED_PREFILL, SHARED_MIXED)
DECODE_KINDS = ("decode", SHARED_DECODE)  # decode-only shapes: also profiled eagerly
# (new tokens, cached tokens before them, is_decode[, (prefix group, prefix tokens)])
Entry = tuple[int, int, bool] | tuple[int, int, bool, tuple[int, int]]


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
    # extrapolates from a few multi-sequence steps (a 4,808-token prompt priced 17 ms took 32 ms).
    # Shapes past max_model_len are skipped: profile with max_model_len >= 16k for them.
    long_prefill_tokens: tuple[int, ...] = (1024, 2048, 3072, 4096, 5120, 6144, 8192)
    long_prefill_contexts: tuple[int, ...] = (0, 4096, 8192, 12288)
    num_random: int = 60
    # Steps whose sequences share a prefix's KV blocks (a prefix-cache hit is the block itself, so
    # a step reads a shared block once per sequence: engine.core.kv_reads). Decode batches whose
    # sequences share one of `groups` prefixes, each sequence with a tail of its own (uniform in
    # [tail/2, 3 tail/2]); prefill chunks after a hit on one prefix; mixed steps whose decodes
    # share one. Without them the fit prices a shared block's repeated reads like first reads
    # (shared-prefix traffic's TPOT 19-34% too high). Prefixes count in whole blocks.
    shared_prefix_tokens: tuple[int, ...] = (1024, 3072)
    shared_prefix_groups: tuple[int, ...] = (1, 8)
    shared_decode_batches: tuple[int, ...] = (32, 128, 256)
    shared_tail: int = 256
    shared_prefill_tokens: tuple[int, ...] = (256, 2048)
    shared_prefill_seqs: tuple[int, ...] = (4, 16)
    shared_mixed_prefill_tokens: tuple[int, ...] = (512, 2048)
    shared_mixed_decodes: tuple[int, ...] = (64, 256)
    num_random_shared: int = 8  # held out, as num_random: any batch, prefix, groups and tails
    warmup: int = 1  # the first execution of a shape compiles any new kernel specialisation
    repeats: int = 5
    min_repeats: int = 3
    max_seconds_per_shape: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("warmup", "num_random", "num_random_shared", "seed"):
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
                   shared_prefix_tokens=(64, 192), shared_prefix_groups=(1, 4), shared_decode_batches=(4, 16),
                   shared_tail=32, shared_prefill_tokens=(64,), shared_prefill_seqs=(4,),
                   shared_mixed_prefill_tokens=(32,), shared_mixed_decodes=(4,), num_random_shared=4,
                   warmup=1, repeats=3, min_repeats=2, max_seconds_per_shape=0.2)

    def shapes(self, sched: SchedulerConfig, rng: np.random.Generator,
               kv: KVCacheSpec | None = None) -> Iterator[tuple[str, str, list[Entry]]]:
        """(set, kind, entries): set "grid" or "random"; kind prefill, decode, mixed, long_prefill or
        one of SHARED_KINDS. kv: random decode batches draw contexts that fit this pool (grid shapes
        that do not fit are skipped)."""
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

        yield from shared_prefix_shapes(self, top, rng, sched.max_num_seqs)


def _spread(rng: np.random.Generator, mean: int, count: int, top: int) -> list[int]:
    return [int(c) for c in np.clip(rng.integers(mean // 2, mean * 3 // 2 + 1, size=count), 1, top)]


def shared_prefix_shapes(grid: ProfileGrid, top: int, rng: np.random.Generator,
                         max_num_seqs: int) -> Iterator[tuple[str, str, list[Entry]]]:
    """The grid's shapes whose sequences share prefixes (ProfileGrid.shared_*), then
    num_random_shared random ones (any batch, prefix, groups and tails: held out). A shape whose
    prefix and longest tail pass top is left out."""
    tail = grid.shared_tail
    fits = grid.shared_tail * 3 // 2 + 1
    for prefix in grid.shared_prefix_tokens:
        for groups in grid.shared_prefix_groups:
            for batch in grid.shared_decode_batches:
                if prefix + fits <= top and groups < batch:  # else no two sequences share a prefix
                    yield "grid", SHARED_DECODE, _shared_decodes(rng, prefix, groups, batch, tail)
        for tokens in grid.shared_prefill_tokens:
            for seqs in grid.shared_prefill_seqs:
                if tokens // seqs >= grid.min_chunk and prefix + tokens // seqs <= top:
                    yield "grid", SHARED_PREFILL, [(tokens // seqs, prefix, False, (0, prefix))] * seqs
    for prefix in grid.shared_prefix_tokens[:1]:  # mixed steps: decodes after the first prefix
        for tokens in grid.shared_mixed_prefill_tokens:
            for decodes in grid.shared_mixed_decodes:
                if tokens <= top and prefix + fits <= top:
                    yield "grid", SHARED_MIXED, [(tokens, 0, False)] + _shared_decodes(rng, prefix, 1, decodes, tail)
    for _ in range(grid.num_random_shared):
        prefix, tail = int(rng.integers(1, top // 2)), int(rng.integers(2, 2 * grid.shared_tail))
        batch, groups = int(rng.integers(2, max_num_seqs + 1)), int(rng.integers(1, 9))
        yield "random", SHARED_DECODE, _shared_decodes(rng, prefix, groups, batch, tail)


def _shared_decodes(rng: np.random.Generator, prefix: int, groups: int, batch: int, tail: int) -> list[Entry]:
    """batch decodes, round-robin over `groups` prefixes of `prefix` tokens, each after a tail of
    its own (uniform in [tail/2, 3 tail/2])."""
    tails = rng.integers(max(tail // 2, 1), tail * 3 // 2 + 1, size=batch)
    return [(1, prefix + int(t), True, (i % groups, prefix)) for i, t in enumerate(tails)]


def build_plan(entries: list[Entry], spec: KVCacheSpec, sched: SchedulerConfig,
               rng: np.random.Generator, vocab_size: int) -> StepPlan | None:
    """A step of these entries (module docstring); None if it exceeds a budget or the pool."""
    prefill = sum(e[0] for e in entries if not e[2])
    decodes = sum(1 for e in entries if e[2])
    if not entries or len(entries) > sched.max_num_seqs or prefill + decodes > sched.max_num_batched_tokens:
        return None
    bs = spec.block_size
    next_block = 0
    prefixes: dict[int, list[int]] = {}  # group -> the blocks of its shared prefix
    scheduled = []
    for i, entry in enumerate(entries):
        n, cached, is_decode = entry[:3]
        table: list[int] = []
        if len(entry) > 3:
            group, shared = entry[3]
            assert shared <= cached, "a shared prefix lies in the cached context"
            if group not in prefixes:
                prefixes[group] = list(range(next_block, next_block + shared // bs))
                next_block += shared // bs
            table = list(prefixes[group])
        need = -(-(cached + n) // bs) - len(table)
        if next_block + need > spec.num_blocks:
            return None
        table += range(next_block, next_block + need)
        next_block += need
        tokens = rng.integers(0, min(vocab_size, MAX_TOKEN_ID), size=n).tolist()
        params = SamplingParams(temperature=TEMPERATURE, ignore_eos=True, seed=int(rng.integers(2**62)))
        scheduled.append(ScheduledRequest(f"profile-{i}", tokens, cached, table, True, params,
                                          1 if is_decode else 0, is_decode))
    kind = "mixed" if prefill and decodes else ("prefill" if prefill else "decode")
    repeated = repeated_block_reads(e.block_table for e in scheduled)
    decode_repeated = repeated_block_reads(e.block_table for e in scheduled if e.is_decode)
    stats = StepStats(0, kind, len(scheduled), prefill, decodes, 0, len(scheduled), spec.num_blocks - next_block, 0, 0,
                      repeated * bs, decode_repeated * bs)
    return StepPlan(scheduled, stats)
