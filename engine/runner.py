"""The model runner: one StepPlan in, one sampled token per scheduled request out.

Per step: build the flat input tensors and the attention metadata from the plan (numpy index
arithmetic, no per-token Python loop), run the model over every scheduled token, compute logits
only at the last token of the requests that sample, and sample.

The runner owns the paged KV cache: one allocation [num_layers, 2, num_blocks, block_size,
num_kv_heads, head_dim], handed to the model as per-layer (k_cache, v_cache) views.

It keeps no per-request state: seeded draws are keyed by (seed, output index) in the sampler,
so plan.released_ids needs no handling here.

Hooks for the GPU path (issue 5): determine_num_blocks() is where KV sizing by profiling lives;
forward() is the one place a CUDA-graph replay of decode-only steps would replace the eager call.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams
from engine.models.arch import ModelArch
from engine.sampler import Sampler

# Default KV-cache budget on CPU when CacheConfig.num_blocks is None. CPU runs are for
# correctness and small experiments; a fixed budget keeps them from taking the host's memory.
CPU_KV_CACHE_BYTES = 512 * 1024**2


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64, row of hidden for each sampling request
    sample_rows: list[int]  # index into plan.scheduled of each sampling request


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        hf_config,
        engine_config: EngineConfig,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        device: torch.device,
    ) -> None:
        self.model = model
        self.arch = ModelArch.from_hf_config(hf_config)
        self.engine_config = engine_config
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype
        self.block_size = cache_config.block_size
        # NOTE: under tensor parallelism a rank holds only its share of the KV heads; the model knows
        # how many (it may replicate heads when there are fewer than ranks).
        self.num_kv_heads = getattr(model, "num_kv_heads", None) or max(
            1, self.arch.num_kv_heads // engine_config.tensor_parallel_size)
        self.sampler = Sampler(engine_config.seed, self.device)
        self.staging = _HostStaging(self.device)
        self.kv_cache: torch.Tensor | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0

    # ---- KV cache --------------------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        """Bytes of K and V for one block over all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.arch.num_layers * self.block_size * self.num_kv_heads * self.arch.head_dim * elem

    def determine_num_blocks(self) -> int:
        """CacheConfig.num_blocks if set; else sized by profiling (CUDA) or a fixed budget (CPU)."""
        if self.cache_config.num_blocks is not None:
            return self.cache_config.num_blocks
        if self.device.type == "cuda":
            return self._profile_num_blocks()
        cfg = self.scheduler_config
        per_seq = -(-cfg.max_model_len // self.block_size)
        # Every running sequence at full length, within the budget, but never less than one
        # full-length sequence (the scheduler would reject any request that cannot fit alone).
        return max(per_seq, min(per_seq * cfg.max_num_seqs, CPU_KV_CACHE_BYTES // self.block_bytes))

    def _profile_num_blocks(self) -> int:
        """Fill gpu_memory_utilization of the device, less the peak of a warm-up at the largest batch.

        NOTE: a first version for issue 5 to refine. The warm-up runs a full-budget prefill
        (max_num_batched_tokens tokens in sequences of up to max_model_len) and a full decode
        batch (max_num_seqs rows of logits through the top-p path, the sampler's worst case),
        over a temporary cache that holds one max-length sequence which all of them share.
        """
        cfg = self.scheduler_config
        per_seq = -(-cfg.max_model_len // self.block_size)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.allocate_kv_cache(per_seq)
        temp_bytes = self.kv_cache.numel() * self.kv_cache.element_size()
        table = list(range(per_seq))
        params = SamplingParams(temperature=1.0, top_p=0.9)
        lengths, left = [], cfg.max_num_batched_tokens
        while left > 0 and len(lengths) < cfg.max_num_seqs:
            lengths.append(min(left, cfg.max_model_len))
            left -= lengths[-1]
        for step in ([[0] * n for n in lengths], [[0]] * cfg.max_num_seqs):
            entries = [ScheduledRequest(f"warmup-{i}", ids, 0, table, True, params, 0, False)
                       for i, ids in enumerate(step)]
            self.execute(StepPlan(entries, StepStats(0, "prefill", len(entries), 0, 0, 0, 0, 0, 0, 0)))
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - temp_bytes
        self.free_kv_cache()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        non_torch = total - free - torch.cuda.memory_reserved(self.device)
        budget = total * self.engine_config.gpu_memory_utilization - non_torch - peak
        num_blocks = int(budget // self.block_bytes)
        if num_blocks < per_seq:
            raise ValueError(
                f"gpu_memory_utilization={self.engine_config.gpu_memory_utilization} leaves room for "
                f"{max(num_blocks, 0)} KV blocks, fewer than one max_model_len={cfg.max_model_len} "
                f"sequence needs ({per_seq}); raise it or lower max_model_len / max_num_batched_tokens"
            )
        return num_blocks

    def free_kv_cache(self) -> None:
        self.kv_caches = []
        self.kv_cache = None
        self.num_blocks = 0

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.free_kv_cache()  # before taking the new one, so that both never coexist
        shape = (self.arch.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.arch.head_dim)
        # Zeros, not empty: padded block-table entries are read (and masked) by some backends,
        # and masked garbage that happens to be NaN would still poison the weighted sum.
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(self.arch.num_layers)]
        self.num_blocks = num_blocks

    # ---- one step ----------------------------------------------------------------------------

    def prepare(self, plan: StepPlan) -> ModelInputs:
        entries = plan.scheduled
        n = len(entries)
        bs = self.block_size
        query_lens = np.fromiter((len(e.token_ids) for e in entries), np.int64, n)
        starts = np.fromiter((e.num_computed_tokens for e in entries), np.int64, n)
        seq_lens = starts + query_lens
        query_start_loc = np.zeros(n + 1, np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        input_ids = np.fromiter(chain.from_iterable(e.token_ids for e in entries), np.int64, num_tokens)
        seq_of_token = np.repeat(np.arange(n), query_lens)  # [num_tokens]
        positions = np.arange(num_tokens) - query_start_loc[seq_of_token] + starts[seq_of_token]
        # Only the blocks that hold context matter; a chunked prompt's table may reach further.
        blocks_needed = (seq_lens + bs - 1) // bs
        counts = blocks_needed.tolist()
        flat_tables = np.fromiter(chain.from_iterable(e.block_table[:c] for e, c in zip(entries, counts)),
                                  np.int64, int(blocks_needed.sum()))
        block_tables = np.zeros((n, int(blocks_needed.max())), np.int64)  # padded with block 0
        # a boolean mask fills row-major, the order of flat_tables
        block_tables[np.arange(block_tables.shape[1]) < blocks_needed[:, None]] = flat_tables
        slot_mapping = block_tables[seq_of_token, positions // bs] * bs + positions % bs
        sample_rows = [i for i, e in enumerate(entries) if e.sample]
        logits_indices = query_start_loc[1:][sample_rows] - 1
        ids, pos, slots, logit_rows = self.staging.upload([input_ids, positions, slot_mapping, logits_indices],
                                                          torch.int64)
        qsl, lens, tables = self.staging.upload([query_start_loc, seq_lens, block_tables], torch.int32)
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=qsl,
            seq_lens=lens,
            block_tables=tables,
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            is_decode_only=bool((query_lens == 1).all()),
        )
        return ModelInputs(ids, pos, meta, logit_rows, sample_rows)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> list[int]:
        """Tokens aligned with plan.scheduled; -1 where an entry does not sample."""
        inputs = self.prepare(plan)
        hidden = self.forward(inputs)
        tokens = [-1] * len(plan.scheduled)
        if not inputs.sample_rows:
            return tokens
        logits = self.model.compute_logits(hidden[inputs.logits_indices])  # [num_sampled, vocab]
        entries = [plan.scheduled[i] for i in inputs.sample_rows]
        sampled = self.sampler.sample(
            logits, [e.sampling_params for e in entries], [e.num_output_tokens for e in entries]
        )
        for row, token in zip(inputs.sample_rows, sampled.tolist()):
            tokens[row] = token
        return tokens


class _HostStaging:
    """Copies a step's index arrays to the device: one host buffer and one transfer per dtype.

    On CUDA the host buffer is pinned and reused, and the copy is non-blocking; an event
    recorded after each copy guards the buffer against being refilled while a copy is in flight.
    On CPU the "upload" is a fresh tensor per step (callers may keep a step's inputs).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pinned = device.type == "cuda"
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._events: dict[torch.dtype, torch.cuda.Event] = {}

    def upload(self, arrays: list[np.ndarray], dtype: torch.dtype) -> list[torch.Tensor]:
        sizes = [a.size for a in arrays]
        total = sum(sizes)
        if self.pinned:
            host = self._pinned(dtype, total)
        else:
            host = torch.empty(total, dtype=dtype)
        np.concatenate([a.ravel() for a in arrays], out=host.numpy())
        if self.pinned:
            flat = host.to(self.device, non_blocking=True)
            event = self._events.setdefault(dtype, torch.cuda.Event())
            event.record()
        else:
            flat = host
        return [part.view(a.shape) for part, a in zip(flat.split(sizes), arrays)]

    def _pinned(self, dtype: torch.dtype, size: int) -> torch.Tensor:
        event = self._events.get(dtype)
        if event is not None:
            event.synchronize()  # the previous copy out of this buffer has finished
        buffer = self._buffers.get(dtype)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, 2 * (0 if buffer is None else buffer.numel()), 4096),
                                 dtype=dtype, pin_memory=True)
            self._buffers[dtype] = buffer
        return buffer[:size]
