"""The model runner: one StepPlan in, one sampled token per scheduled request out.

Per step: build the flat index arrays of the batch on the host (numpy, no per-token Python loop),
upload them with one pinned, non-blocking copy per dtype, run the model over every scheduled
token (a CUDA-graph replay for decode batches and for prefill or mixed steps that have a graph,
eagerly otherwise), compute
logits only at the last token of the requests that sample, and sample.

The runner owns the paged KV cache: one allocation [num_layers, 2, num_blocks, block_size,
num_kv_heads, head_dim], handed to the model as per-layer (k_cache, v_cache) views. It keeps no
per-request state: seeded draws are keyed by (seed, output index) in the sampler, so
plan.released_ids needs no handling here.

Under tensor parallelism every rank holds a runner; rank 0 (the driver) builds each step's
HostBatch, hands it to the other ranks, and alone samples.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from itertools import chain
from typing import Callable

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.graph_sizes import prefill_graph_sizes
from engine.core.plan import StepPlan
from engine.cuda_graph import DecodeGraphs, graph_batch_sizes
from engine.host_staging import HostStaging
from engine.kv_sizing import MemoryProfile, num_kv_blocks, profile_memory, warmup_plans
from engine.layers.fused import set_fused_kernels
from engine.models.arch import ModelArch
from engine.overlap import DeviceClock, PendingTokens, placeholder_sources, wall_pending
from engine.prefill_graphs import PrefillGraphs
from engine.sampler import Sampler
from engine.step_timing import StepTimer
from kernels.decode_split import balanced_chunk
from kernels.prefill_tiles import query_tiles

log = logging.getLogger(__name__)

# Default KV-cache budget on CPU when CacheConfig.num_blocks is None. CPU runs are for
# correctness and small experiments; a fixed budget keeps them from taking the host's memory.
CPU_KV_CACHE_BYTES = 512 * 1024**2


@dataclass
class HostBatch:
    """A step's model inputs as host arrays: what the driver sends to the other TP ranks.

    For a decode graph step (graph_size set) the rows are padded to graph_size: token 0, position
    0, slot -1, context length 0, and the block tables are max_blocks_per_seq wide. For a prefill
    graph step (prefill_graph set) token rows are padded to prefill_graph and sequence rows to
    the graph's sequence count (no query tokens, context 0), and a tile map comes along.
    """

    input_ids: np.ndarray  # [rows] int64
    positions: np.ndarray  # [rows] int64
    slot_mapping: np.ndarray  # [rows] int64
    logits_indices: np.ndarray  # [num_sampled] int64, row of hidden for each sampling request
    seq_lens: np.ndarray  # [num_seqs or graph_size] int32
    query_start_loc: np.ndarray  # [num_seqs or graph_size + 1] int32
    block_tables: np.ndarray  # [num_seqs or graph_size, width] int32
    max_query_len: int
    max_seq_len: int
    num_seqs: int  # real sequences (rows past it are graph padding)
    graph_size: int | None
    sample_rows: list[int]  # index into plan.scheduled of each sampling request
    prefill_graph: int | None = None
    tile_seq: np.ndarray | None = None  # [graph's tile count] int32 (kernels.prefill_tiles)
    tile_start: np.ndarray | None = None
    decode_chunk: np.ndarray | None = None  # [1] int32, decode steps on CUDA (kernels.decode_split)

    def int64_arrays(self) -> list[np.ndarray]:
        # NOTE: this order is DecodeGraphs' buffer layout (ids, positions, slots, logits rows)
        return [self.input_ids, self.positions, self.slot_mapping, self.logits_indices]

    def int32_arrays(self) -> list[np.ndarray]:
        # NOTE: DecodeGraphs' layout again (seq_lens, query_start_loc, block_tables, decode
        # chunk), PrefillGraphs' (the same three, then the tile map)
        arrays = [self.seq_lens, self.query_start_loc, self.block_tables]
        if self.decode_chunk is not None:
            arrays.append(self.decode_chunk)
        return arrays if self.tile_seq is None else [*arrays, self.tile_seq, self.tile_start]


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64
    sample_rows: list[int]
    num_seqs: int = 0
    graph_size: int | None = None
    prefill_graph: int | None = None


def _num_computed(entry) -> int:
    return entry.num_computed_tokens


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        hf_config,
        engine_config: EngineConfig,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        device: torch.device,
        driver: bool = True,
    ) -> None:
        self.model = model
        self.hf_config = hf_config
        self.arch = ModelArch.from_hf_config(hf_config)
        self.engine_config = engine_config
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.device = torch.device(device)
        self.driver = driver  # samples; False on tensor-parallel ranks other than 0
        self.dtype = next(model.parameters()).dtype
        self.block_size = cache_config.block_size
        # NOTE: under tensor parallelism a rank holds only its share of the KV heads; the model knows
        # how many (it may replicate heads when there are fewer than ranks).
        self.num_kv_heads = getattr(model, "num_kv_heads", None) or max(
            1, self.arch.num_kv_heads // engine_config.tensor_parallel_size)
        self.max_blocks_per_seq = -(-scheduler_config.max_model_len // self.block_size)
        # Decode steps tell the Triton decode kernel their fair share of keys per program, so
        # that a ragged batch costs what an even one of the same total does (kernels.decode_split).
        # Read when graphs are captured.
        self.balance_decode = engine_config.balanced_decode and self.device.type == "cuda"
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self.balance_decode else 0
        # before any graph capture: graphs replay whichever elementwise kernels the layers use
        set_fused_kernels(model, engine_config.fused_kernels, self.device)
        self.sampler = Sampler(engine_config.seed, self.device, engine_config.fused_kernels)
        self.staging = HostStaging(self.device)
        self.kv_cache: torch.Tensor | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0
        self.memory_profile: MemoryProfile | None = None
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.timer: StepTimer | None = None  # attach one to record per-step phase times
        # overlapped steps (submit()): the previous step's sampled ids, and each sampling
        # request's row in them; two pinned buffers the ids come back through, used in turn
        self._last_sampled: torch.Tensor | None = None
        self._last_sampled_rows: dict[str, int] = {}
        self._device_clock = DeviceClock()
        self._host_ids: list[torch.Tensor] = []
        self._host_ids_turn = 0

    # ---- KV cache --------------------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        """Bytes of K and V for one block over all layers."""
        elem = self.dtype.itemsize
        return 2 * self.arch.num_layers * self.block_size * self.num_kv_heads * self.arch.head_dim * elem

    def determine_num_blocks(self, graph_reserve: bool = False) -> int:
        """CacheConfig.num_blocks if set; else sized by profiling (CUDA) or a fixed budget (CPU).

        graph_reserve: keep room for the CUDA-graph pool (set when graphs will be captured).
        """
        if self.cache_config.num_blocks is not None:
            return self.cache_config.num_blocks
        if self.device.type == "cuda":
            self.memory_profile = profile_memory(self, graph_reserve)
            blocks = num_kv_blocks(self.memory_profile, self.engine_config.gpu_memory_utilization,
                                   self.block_bytes, self.max_blocks_per_seq)
            log.info("KV cache: %d blocks of %d tokens (%.2f GiB); %s", blocks, self.block_size,
                     blocks * self.block_bytes / 1024**3,
                     self.memory_profile.describe(self.engine_config.gpu_memory_utilization))
            return blocks
        cfg = self.scheduler_config
        per_seq = self.max_blocks_per_seq
        # Every running sequence at full length, within the budget, but never less than one
        # full-length sequence (the scheduler would reject any request that cannot fit alone).
        return max(per_seq, min(per_seq * cfg.max_num_seqs, CPU_KV_CACHE_BYTES // self.block_bytes))

    def warm_up(self) -> bool:
        """Run the largest steps (kv_sizing.warmup_plans) once over the allocated cache, so that
        kernel compilation and first-use costs land here, not in a measured run's first steps
        (2.7 s on the first step of an H100 run with a pinned block count). Profiling does this
        when it sizes the cache; call it when the block count was given. Needs a cache of at
        least one max_model_len sequence (the plans share blocks 0..n-1); False when smaller."""
        if self.kv_cache is None or self.num_blocks < self.max_blocks_per_seq:
            return False
        with torch.inference_mode():
            for plan in warmup_plans(self.scheduler_config, self.block_size):
                self.execute(plan)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return True

    def free_kv_cache(self) -> None:
        self.graphs = self.prefill_graphs = None  # graphs hold the cache's addresses
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

    def capture_decode_graphs(self, capture: bool = True) -> None:
        """Decode graphs for batch sizes up to max_num_seqs over the allocated cache.
        capture=False keeps the padded static-buffer path but runs it eagerly (tests on CPU)."""
        if self.kv_cache is None:
            raise RuntimeError("capture_decode_graphs() needs the KV cache: call allocate_kv_cache() first")
        self.graphs = None  # release the old graphs' memory pool before capturing the new ones
        # into the prefill graphs' pool where they were captured first: one pool for all
        pool = self.prefill_graphs.pool if self.prefill_graphs is not None else None
        self.graphs = DecodeGraphs(self.model, self.kv_caches, graph_batch_sizes(self.scheduler_config.max_num_seqs),
                                   self.max_blocks_per_seq, self.scheduler_config.max_model_len, self.device, capture,
                                   pool, self.balance_decode)

    def capture_prefill_graphs(self, max_tokens: int, capture: bool = True) -> None:
        """Graphs for prefill and mixed steps of up to max_tokens tokens (engine.prefill_graphs);
        call before capture_decode_graphs, which then shares their memory pool. Needs an
        attention backend that reads tile maps (Triton; the torch backend ignores them, which
        serves capture=False on CPU)."""
        if self.kv_cache is None:
            raise RuntimeError("capture_prefill_graphs() needs the KV cache: call allocate_kv_cache() first")
        # the decode graphs go too: they live in the old prefill graphs' pool
        self.graphs = self.prefill_graphs = None
        sizes = prefill_graph_sizes(min(max_tokens, self.scheduler_config.max_num_batched_tokens))
        if not sizes:
            return
        attn = self.model.model.layers[0].self_attn
        self.prefill_graphs = PrefillGraphs(
            self.model, self.kv_caches, sizes, self.scheduler_config.max_num_seqs, self.max_blocks_per_seq,
            self.scheduler_config.max_model_len, attn.num_heads // attn.num_kv_heads, self.device, capture)
        self.prefill_graphs.capture()

    # ---- one step ----------------------------------------------------------------------------

    def build_batch(self, plan: StepPlan) -> HostBatch:
        entries = plan.scheduled
        n = len(entries)
        bs = self.block_size
        # NOTE: map/chain over plain lists iterate in C; per-entry generators cost ~3x more.
        token_lists = [e.token_ids for e in entries]
        tables = [e.block_table for e in entries]
        query_lens = np.fromiter(map(len, token_lists), np.int64, n)
        starts = np.fromiter(map(_num_computed, entries), np.int64, n)
        seq_lens = starts + query_lens
        query_start_loc = np.zeros(n + 1, np.int64)
        np.cumsum(query_lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        decode_only = num_tokens == n
        graph_size = self.graphs.padded_size(n) if self.graphs is not None and decode_only else None
        prefill_graph = None
        if self.prefill_graphs is not None and not decode_only:
            prefill_graph = self.prefill_graphs.padded_size(num_tokens)
        # graph steps carry padding rows past the step's tokens and sequences
        token_rows = graph_size or prefill_graph or num_tokens
        seq_rows = graph_size or (self.prefill_graphs.seqs(prefill_graph) if prefill_graph else n)
        input_ids = np.zeros(token_rows, np.int64)
        input_ids[:num_tokens] = np.fromiter(chain.from_iterable(token_lists), np.int64, num_tokens)
        if decode_only:
            seq_of_token, positions = np.arange(n), starts
        else:
            seq_of_token = np.repeat(np.arange(n), query_lens)  # [num_tokens]
            positions = np.arange(num_tokens) - query_start_loc[seq_of_token] + starts[seq_of_token]
        # Only the blocks that hold context matter; a chunked prompt's table may reach further.
        blocks_needed = (seq_lens + bs - 1) // bs
        total_blocks = int(blocks_needed.sum())
        if sum(map(len, tables)) == total_blocks:  # the usual case: tables hold exactly the context
            flat_tables = np.fromiter(chain.from_iterable(tables), np.int64, total_blocks)
        else:
            flat_tables = np.fromiter(chain.from_iterable(t[:c] for t, c in zip(tables, blocks_needed.tolist())),
                                      np.int64, total_blocks)
        # NOTE: a fixed width for graphs; otherwise a multiple of 16, so that the Triton kernels,
        # which specialise on their integer arguments (the table's row stride among them), are
        # not recompiled in the middle of a run when the widest table changes.
        width = self.max_blocks_per_seq if graph_size or prefill_graph else -(-int(blocks_needed.max()) // 16) * 16
        block_tables = np.zeros((seq_rows, width), np.int32)  # padded with block 0
        # a boolean mask fills row-major, the order of flat_tables
        block_tables[:n][np.arange(width) < blocks_needed[:, None]] = flat_tables
        slot_mapping = np.full(token_rows, -1, np.int64)
        slot_mapping[:num_tokens] = block_tables[seq_of_token, positions // bs].astype(np.int64) * bs + positions % bs
        sample_rows = [i for i, e in enumerate(entries) if e.sample]
        logits_indices = query_start_loc[1:][sample_rows] - 1
        max_query_len, max_seq_len = int(query_lens.max()), int(seq_lens.max())
        tile_seq = tile_start = None
        if prefill_graph:
            graphs = self.prefill_graphs
            tile_seq, tile_start = query_tiles(query_lens, seq_lens, graphs.block_q(prefill_graph),
                                               graphs.num_tiles(prefill_graph))
            query_start_loc = np.concatenate([query_start_loc, np.full(seq_rows - n, num_tokens)])
        elif graph_size:
            query_start_loc = np.arange(seq_rows + 1)
        if token_rows > num_tokens:
            positions = np.concatenate([positions, np.zeros(token_rows - num_tokens, np.int64)])
        decode_chunk = None
        if decode_only and self.balance_decode:
            decode_chunk = np.array([balanced_chunk(seq_lens, self.num_kv_heads, self.num_sms)], np.int32)
        if seq_rows > n:
            seq_lens = np.concatenate([seq_lens, np.zeros(seq_rows - n, np.int64)])
        return HostBatch(
            input_ids, positions, slot_mapping, logits_indices, seq_lens.astype(np.int32),
            query_start_loc.astype(np.int32), block_tables, max_query_len=max_query_len,
            max_seq_len=max_seq_len, num_seqs=n, graph_size=graph_size, sample_rows=sample_rows,
            prefill_graph=prefill_graph, tile_seq=tile_seq, tile_start=tile_start, decode_chunk=decode_chunk,
        )

    def upload(self, batch: HostBatch) -> ModelInputs:
        if batch.graph_size:
            # straight into the static buffers the graphs read
            self.staging.upload(batch.int64_arrays(), torch.int64, out=self.graphs.int64)
            self.staging.upload(batch.int32_arrays(), torch.int32, out=self.graphs.int32)
            ids, pos, meta = self.graphs.views(batch.graph_size)
            rows = self.graphs.logits_rows(batch.graph_size, len(batch.sample_rows))
            return ModelInputs(ids, pos, meta, rows, batch.sample_rows, batch.num_seqs, batch.graph_size)
        if batch.prefill_graph:
            graphs = self.prefill_graphs
            self.staging.upload(batch.int64_arrays(), torch.int64, out=graphs.int64)
            self.staging.upload(batch.int32_arrays(), torch.int32, out=graphs.int32)
            ids, pos, meta = graphs.views(batch.prefill_graph)
            rows = graphs.logits_rows(batch.prefill_graph, len(batch.sample_rows))
            return ModelInputs(ids, pos, meta, rows, batch.sample_rows, batch.num_seqs,
                               prefill_graph=batch.prefill_graph)
        ids, pos, slots, rows = self.staging.upload(batch.int64_arrays(), torch.int64)
        lens, qsl, tables, *chunk = self.staging.upload(batch.int32_arrays(), torch.int32)
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=qsl,
            seq_lens=lens,
            block_tables=tables,
            max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len,
            is_decode_only=batch.max_query_len == 1,
            decode_chunk=chunk[0] if chunk else None,
        )
        return ModelInputs(ids, pos, meta, rows, batch.sample_rows, batch.num_seqs)

    def prepare(self, plan: StepPlan) -> ModelInputs:
        return self.upload(self.build_batch(plan))

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [num_tokens, hidden]
        if inputs.graph_size:
            return self.graphs.run(inputs.graph_size, inputs.num_seqs)
        if inputs.prefill_graph:
            return self.prefill_graphs.run(inputs.prefill_graph)
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

    @torch.inference_mode()
    def execute(self, plan: StepPlan, on_batch: Callable[[HostBatch], None] | None = None) -> list[int] | None:
        """Tokens aligned with plan.scheduled; -1 where an entry does not sample (None on a
        non-driver rank). on_batch sees the built batch first: the driver hands it to the other
        tensor-parallel ranks there."""
        if self.timer:
            self.timer.mark()
        batch = self.build_batch(plan)
        if on_batch is not None:
            on_batch(batch)
        return self.execute_batch(batch, plan if self.driver else None)

    @torch.inference_mode()
    def execute_batch(self, batch: HostBatch, plan: StepPlan | None) -> list[int] | None:
        """Run a built batch. plan is None on non-driver TP ranks: they take part in every
        collective (the LM head's gather included) and return None."""
        timer = self.timer
        inputs = self.upload(batch)
        if timer:
            timer.mark()
        hidden = self.forward(inputs)
        if timer:
            timer.mark()
        if not inputs.sample_rows:
            if timer:
                timer.finish()  # discarded: a step with nothing to sample is not a full record
            return None if plan is None else [-1] * len(plan.scheduled)
        logits = self.model.compute_logits(hidden[inputs.logits_indices], upcast=False)  # [num_sampled, vocab]
        if plan is None:
            return None
        tokens = [-1] * len(plan.scheduled)
        sampled, _ = self._sample(plan, inputs.sample_rows, logits)
        for row, token in zip(inputs.sample_rows, sampled.tolist()):
            tokens[row] = token
        if timer:
            timer.mark()
            timer.finish(num_seqs=batch.num_seqs, num_tokens=int(batch.input_ids.shape[0]),
                         graph_size=batch.graph_size or batch.prefill_graph or 0)
        return tokens

    def _sample(self, plan: StepPlan, sample_rows: list[int], logits: torch.Tensor):
        """(sampled ids on the device [num_sampled], the entries they belong to)."""
        entries = [plan.scheduled[i] for i in sample_rows]
        params = [e.sampling_params for e in entries]
        return self.sampler.sample(logits, params, [e.num_output_tokens for e in entries]), entries

    @torch.inference_mode()
    def submit(self, plan: StepPlan) -> PendingTokens:
        """Queue a step on the device and return at once (engine.overlap). Its placeholder inputs
        take the ids the previously submitted step sampled. Driver rank, no tensor parallelism."""
        timer = self.timer
        if timer:
            timer.mark()
        started = time.perf_counter()
        if plan.stats.step == 0:  # a new run (a fresh scheduler): the device's idle time since the last one is not this run's
            self._device_clock.last_end = None
            self._device_clock.last_return = None
        clock = self._device_clock
        # NOTE: re-anchored whenever the device has nothing queued (a profiling spin counts as
        # queued): the GPU timer and the host clock drift apart (experiments/prefill_graphs/README.md)
        if self.device.type == "cuda" and torch.cuda.current_stream(self.device).query():
            clock.set_anchor()
        batch = self.build_batch(plan)
        placeholders = placeholder_sources(plan, batch.query_start_loc, batch.input_ids, self._last_sampled_rows)
        cuda = self.device.type == "cuda"
        start = None
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        inputs = self.upload(batch)
        if placeholders is not None:
            rows, sources = self.staging.upload(list(placeholders), torch.int64)
            inputs.input_ids.index_copy_(0, rows, self._last_sampled.index_select(0, sources))
        if timer:
            timer.mark()
        hidden = self.forward(inputs)
        if timer:
            timer.mark()
        sampled = None
        self._last_sampled_rows = {}
        if inputs.sample_rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices], upcast=False)
            sampled, entries = self._sample(plan, inputs.sample_rows, logits)
            self._last_sampled_rows = {e.request_id: k for k, e in enumerate(entries)}
        self._last_sampled = sampled
        on_done = None
        if timer:
            timer.mark()
            marks = timer.detach()
            fields = dict(num_seqs=batch.num_seqs, num_tokens=int(batch.input_ids.shape[0]),
                          graph_size=batch.graph_size or batch.prefill_graph or 0)
            on_done = lambda: timer.record(*marks, **fields)  # noqa: E731 - once the events are complete
        if not cuda:
            pending = wall_pending(self._device_clock, started, len(plan.scheduled), inputs.sample_rows, sampled)
            pending.on_done = on_done
            return pending
        host_ids = None
        if sampled is not None:
            host_ids = self._host_ids_buffer()[: sampled.numel()]
            host_ids.copy_(sampled, non_blocking=True)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        clock = self._device_clock
        pending = PendingTokens(len(plan.scheduled), inputs.sample_rows, host_ids, start, end, clock.last_end,
                                on_done=on_done, clock=clock)
        clock.last_end = end
        return pending

    def _host_ids_buffer(self) -> torch.Tensor:
        # NOTE: two suffice: step N+2 is submitted only after step N's ids were read
        if not self._host_ids:
            size = self.scheduler_config.max_num_seqs
            self._host_ids = [torch.empty(size, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._host_ids_turn ^= 1
        return self._host_ids[self._host_ids_turn]
