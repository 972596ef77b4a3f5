"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Sampling is Gumbel-max: the token is argmax(logits / T - log E) with E ~ Exp(1) per vocabulary
entry, which draws from softmax(logits / T) exactly and needs no softmax or multinomial. Top-k and
top-p become one cutoff logit per row (engine/sampler_filters.py); entries below it are excluded.

NOTE: a request with a seed draws its noise from a counter-based hash keyed by (seed, index of
the token being sampled) (engine/sampler_noise.py). The draw is therefore a function of the
request alone: the same whatever batch it shares, wherever it sits in it, and after a preemption
(the recomputed request samples its next token with the same index). All seeded rows of a batch
are drawn in one pass, and no per-request state has to be kept or released. Requests without a
seed share the sampler's own stream, seeded once by EngineConfig.seed.

Two paths. The torch path (the reference; on CPU, and on CUDA with fused_kernels="off") computes
the hash as integer tensor ops. The kernel path (fused_kernels="triton", the engine's default, on
CUDA) samples every row in one Triton pass over the logits (kernels/sampling.py). Unseeded rows
get hash keys from a numpy stream seeded by EngineConfig.seed, except on the torch path on CUDA,
where torch's generator draws their noise.

Host work per step is kept off the device's critical path: the per-row parameters are turned
into device tensors once per batch composition (decode batches keep theirs for many steps), and
what changes every step (the seeded rows' keys) goes up in one pinned, non-blocking copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.config import FUSED_KERNELS as FUSED_KERNEL_MODES
from engine.core.sampling_params import SamplingParams, samples_by_shard
from engine.host_staging import HostStaging
from engine.sampler_filters import FilterGroup, FilterPlan, cutoffs, plan_filters
from engine.sampler_noise import key_words, keys_for, log_exponential, seed_for
from engine.sharded_sampling import ShardDraw

__all__ = ["Sampler", "seed_for"]

# Exp(1) draws are clamped away from 0 so that -log(E) stays finite (-inf logits stay -inf).
_TINY = 1e-20


@dataclass
class _Rows:
    """What a batch composition (its list of SamplingParams) needs, on the host and the device."""

    params: list[SamplingParams]  # held, so identity comparison with the next step is sound
    vocab: int
    all_greedy: bool
    seeded_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [S]
    seeds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # [S]
    num_unseeded: int = 0  # rows sampled from the engine's stream
    inv_temp: torch.Tensor | None = None  # [N] float32; greedy rows: 1 (torch path) or 0 (kernel)
    shard_inv_temp: np.ndarray | None = None  # [N] float32 on the host, greedy rows 0 (engine.sharded_sampling)
    greedy_rows: torch.Tensor | None = None  # [G] int64, torch path, None when G == 0
    seeded_index: torch.Tensor | None = None  # [S] int64, torch path
    groups: list[FilterGroup] = field(default_factory=list)
    by_shard: bool = True  # engine.core.sampling_params.samples_by_shard, once per composition


class Sampler:
    """Draws one token per row of a logits batch."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu", fused_kernels: str = "off",
                 *, allow_cpu_kernels: bool = False) -> None:
        """allow_cpu_kernels: take the kernel path for CPU tensors too (tests under TRITON_INTERPRET=1)."""
        if fused_kernels not in FUSED_KERNEL_MODES:
            raise ValueError(f"fused_kernels must be one of {FUSED_KERNEL_MODES}, got {fused_kernels!r}")
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        self.staging = HostStaging(self.device)
        self._rows: _Rows | None = None
        self._gumbel_argmax = None
        if fused_kernels == "triton" and (self.device.type == "cuda" or allow_cpu_kernels):
            from kernels.sampling import gumbel_argmax

            self._gumbel_argmax = gumbel_argmax
        # NOTE: on the CPU the hash is cheaper than torch's exponential_ (~0.6x), on CUDA far
        # dearer as ~25 separate integer passes; there unseeded rows keep torch's generator
        # unless the kernel computes the hash in registers.
        self.hash_every_row = self._gumbel_argmax is not None or self.device.type != "cuda"

    @property
    def uses_kernel(self) -> bool:
        return self._gumbel_argmax is not None

    @torch.inference_mode()
    def sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab] float32 (or the model's dtype: upcast here if needed)
        params: Sequence[SamplingParams],
        output_indices: Sequence[int],  # per row: how many tokens the request has generated so far
    ) -> torch.Tensor:  # [num_rows] int64
        num_rows, vocab = logits.shape
        if num_rows != len(params) or num_rows != len(output_indices):
            raise ValueError(f"Sampler.sample: {num_rows} logits rows, {len(params)} params, "
                             f"{len(output_indices)} output indices")
        rows = self._composition(params, vocab)
        if rows.all_greedy:
            return logits.argmax(dim=-1)  # exact in any dtype: an upcast changes no value
        if self._gumbel_argmax is None or rows.groups:
            # NOTE: the kernel reads any float dtype as float32 itself; the top-k/top-p cutoffs and
            # the torch path compute in the logits' dtype, so they get float32 (the reference)
            logits = logits.float()
        words = self._upload_keys(rows, num_rows, output_indices)  # [S or N, 2] int32
        cutoff = cutoffs(logits, rows.groups)  # [N] float32 or None
        if self._gumbel_argmax is not None:
            return self._gumbel_argmax(logits, rows.inv_temp, words, cutoff)
        scores = logits * rows.inv_temp[:, None]  # [N, vocab]
        if cutoff is not None:
            scores.masked_fill_(logits < cutoff[:, None], float("-inf"))
        log_e = self._log_noise(rows, words, scores)  # [N, vocab]
        if rows.greedy_rows is not None:
            log_e.index_fill_(0, rows.greedy_rows, 0.0)  # no noise: the argmax of the logits
        return scores.sub_(log_e).argmax(dim=-1)

    def shard_draw(self, params: Sequence[SamplingParams], output_indices: Sequence[int],
                   vocab: int) -> ShardDraw | None:
        """The draw of a step whose rows tensor-parallel ranks sample from their vocabulary slices
        (engine.sharded_sampling), or None when they cannot: a row filters by top-k or top-p, or
        the noise of unseeded rows comes from torch's generator (the torch path on CUDA). Takes
        the same draws from the engine's stream as sample() would."""
        if not self.hash_every_row:
            return None
        n = len(params)
        rows = self._composition(params, vocab)
        if rows.all_greedy:
            return ShardDraw(np.zeros(n, np.float32), np.zeros((n, 2), np.int32))
        if not rows.by_shard:
            return None
        return ShardDraw(rows.shard_inv_temp, key_words(self._host_keys(rows, n, output_indices)))

    def _log_noise(self, rows: _Rows, words: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
        """log E [N, vocab], E ~ Exp(1): hashed for every row, or torch's generator for the
        unseeded rows with the hash written over the seeded ones (torch path on CUDA)."""
        num_rows, vocab = scores.shape
        if self.hash_every_row:
            return log_exponential(words, vocab)
        if not len(rows.seeded_rows):
            return self._generator_noise(scores)
        seeded = log_exponential(words, vocab)  # [S, vocab]
        if len(rows.seeded_rows) == num_rows:
            return seeded
        # the other rows are unseeded (the generator draws them) or all greedy (no noise)
        log_e = self._generator_noise(scores) if rows.num_unseeded else torch.zeros_like(scores)
        return log_e.index_copy_(0, rows.seeded_index, seeded)

    def _generator_noise(self, scores: torch.Tensor) -> torch.Tensor:
        """log E [N, vocab] drawn from the sampler's own torch generator."""
        return torch.empty_like(scores).exponential_(generator=self.generator).clamp_min_(_TINY).log_()

    def _upload_keys(self, rows: _Rows, num_rows: int, output_indices: Sequence[int]) -> torch.Tensor | None:
        """This step's noise keys as int32 words: [N, 2] when every row is hashed, else [S, 2] (seeded rows)."""
        keys = self._host_keys(rows, num_rows, output_indices)
        if keys is None:
            return None  # torch path, no seeded row: no keys this step
        return self.staging.upload([key_words(keys)], torch.int32)[0]

    def _host_keys(self, rows: _Rows, num_rows: int, output_indices: Sequence[int]) -> np.ndarray | None:
        """This step's noise keys [N] (every row hashed) or [S] (seeded rows) uint64; None when none."""
        seeded = rows.seeded_rows
        keys = None
        if len(seeded):
            indices = np.asarray(output_indices, dtype=np.int64)[seeded]
            keys = keys_for(rows.seeds, indices)
        if self.hash_every_row:
            every = self.rng.integers(0, 2**64, size=num_rows, dtype=np.uint64)  # unseeded rows' keys
            if keys is not None:
                every[seeded] = keys
            keys = every
        return keys

    def _composition(self, params: Sequence[SamplingParams], vocab: int) -> _Rows:
        """The cached _Rows of this batch composition, rebuilt only when a row's params change."""
        last = self._rows
        # NOTE: list equality checks identity first, so the common case (the same request objects
        # step after step) costs a pointer comparison per row.
        if last is not None and last.vocab == vocab and last.params == list(params):
            return last
        self._rows = rows = self._build(list(params), vocab)
        return rows

    def _build(self, params: list[SamplingParams], vocab: int) -> _Rows:
        n = len(params)
        temperature = np.fromiter((p.temperature for p in params), np.float64, n)
        greedy = temperature == 0.0
        if greedy.all():
            return _Rows(params, vocab, all_greedy=True)
        kernel = self._gumbel_argmax is not None
        inv_temp = np.where(greedy, 0.0 if kernel else 1.0, 1.0 / np.where(greedy, 1.0, temperature))
        seeds = [p.seed for p in params]
        seeded_rows = np.flatnonzero(np.fromiter((s is not None for s in seeds), bool, n) & ~greedy)
        plans: list[FilterPlan] = plan_filters(
            np.fromiter((p.top_k for p in params), np.int64, n), np.fromiter((p.top_p for p in params), np.float64, n),
            inv_temp, ~greedy, vocab)
        # one copy per dtype: the per-row floats, then every index array
        floats = [inv_temp.astype(np.float32)]
        for plan in plans:
            floats += [plan.inv_temp] + ([plan.top_p] if plan.top_p is not None else [])
        greedy_rows = np.flatnonzero(greedy)
        ints = [greedy_rows, seeded_rows] + [a for plan in plans for a in (plan.rows, plan.top_k)]
        f32 = iter(self.staging.upload(floats, torch.float32))
        i64 = iter(self.staging.upload([a.astype(np.int64) for a in ints], torch.int64))
        rows = _Rows(params, vocab, all_greedy=False, seeded_rows=seeded_rows,
                     seeds=np.array([seeds[i] for i in seeded_rows.tolist()], dtype=np.uint64),
                     num_unseeded=int((~greedy).sum()) - len(seeded_rows), inv_temp=next(f32),
                     shard_inv_temp=np.where(greedy, 0.0, inv_temp).astype(np.float32),
                     by_shard=samples_by_shard(params))
        device_greedy, rows.seeded_index = next(i64), next(i64)
        rows.greedy_rows = device_greedy if len(greedy_rows) and not kernel else None
        for plan in plans:
            plan_inv, plan_p = next(f32), (next(f32) if plan.top_p is not None else None)
            plan_rows, plan_k = next(i64), next(i64)
            rows.groups.append(FilterGroup(None if plan.all_rows else plan_rows, plan_k, plan_p, plan_inv, plan.width))
        return rows
