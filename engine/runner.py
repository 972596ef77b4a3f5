"""The model runner: one StepPlan in, one sampled token per scheduled request out.

Per step: build the flat index arrays of the batch on the host (engine.batch), upload them with
one pinned, non-blocking copy per dtype (engine.model_inputs), run the model over every
scheduled token (a CUDA-graph replay for decode batches and for prefill or mixed steps that have
a graph, engine.cuda_graph and engine.prefill_graphs; eagerly otherwise), compute logits only at
the last token of the requests that sample, and sample (engine.step_sampling). A step runs to
completion (execute) or is queued and returned at once (submit: engine.overlap); both take the
same path through the device work (_launch).

The runner owns the paged KV cache: one allocation [num_layers, 2, num_blocks, block_size,
num_kv_heads, head_dim], handed to the model as per-layer (k_cache, v_cache) views. It keeps no
per-request state: seeded draws are keyed by (seed, output index) in the sampler, so
plan.released_ids needs no handling here.

Under tensor parallelism every rank holds a runner; rank 0 (the driver) builds each step's
HostBatch and hands it to the other ranks. Where the rows allow it, the batch carries the step's
draw and every rank samples its slice of the vocabulary (engine.sharded_sampling); otherwise the
ranks gather the logits and rank 0 alone samples. Overlapped, rank 0 hands them the step's
placeholder map too and, when it alone sampled, broadcasts the ids on the device
(engine.overlap); the other ranks run the same step through follow().
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch

from engine.batch import HostBatch, build_host_batch
from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.model_shapes import ModelShape
from engine.core.plan import StepPlan
from engine.cuda_graph import DecodeGraphs
from engine.host_staging import HostStaging
from engine.kv_sizing import (
    MemoryProfile,
    cpu_kv_blocks,
    kv_cache_torch_dtype,
    profile_memory,
    profiled_kv_blocks,
    warm_up,
)
from engine.layers.fused import set_fused_kernels
from engine.layers.moe import attach_expert_counter
from engine.model_inputs import ModelInputs, upload_batch
from engine.overlap import PendingTokens, Placeholders, StepOverlap
from engine.prefill_graphs import PrefillGraphs
from engine.runner_graphs import capture_decode_graphs, capture_prefill_graphs
from engine.sampler import Sampler
from engine.sharded_sampling import ShardedSampler
from engine.step_sampling import sample_step, step_logits, tokens_per_entry
from engine.step_timing import StepTimer


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
        broadcast: Callable[[torch.Tensor], torch.Tensor] | None = None,
        all_gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """broadcast, all_gather: the tensor-parallel group's broadcast from rank 0 (overlapped
        steps send the ids rank 0 sampled through it) and concatenation over ranks (the ranks'
        vocabulary slices exchange their best tokens through it); None without tensor parallelism."""
        self.model = model
        self.hf_config = hf_config
        self.shape = ModelShape.from_hf_config(hf_config)
        self.engine_config = engine_config
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.device = torch.device(device)
        self.driver = driver  # samples; False on tensor-parallel ranks other than 0
        self.dtype = next(model.parameters()).dtype
        self.kv_dtype = kv_cache_torch_dtype(cache_config.kv_cache_dtype, self.dtype)
        self.block_size = cache_config.block_size
        # NOTE: under tensor parallelism a rank holds only its share of the KV heads; the model knows
        # how many (it may replicate heads when there are fewer than ranks).
        self.num_kv_heads = getattr(model, "num_kv_heads", None) or max(
            1, self.shape.num_kv_heads // engine_config.execution.tensor_parallel_size)
        self.max_blocks_per_seq = -(-scheduler_config.max_model_len // self.block_size)
        # Decode steps tell the Triton decode kernel their fair share of keys per program, so
        # that a ragged batch costs what an even one of the same total does (kernels.decode_split).
        # Read per step (build_batch) and when decode graphs are captured.
        self.balance_decode = engine_config.balanced_decode and self.device.type == "cuda"
        self.num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count if self.balance_decode else 0
        # before any graph capture: graphs replay whichever elementwise kernels the layers use, and
        # the expert counter's adds where it records
        set_fused_kernels(model, engine_config.fused_kernels, self.device)
        self.expert_counter = attach_expert_counter(model, self.device) if (
            engine_config.record_expert_counts and driver) else None
        self.sampler = Sampler(engine_config.execution.seed, self.device, engine_config.fused_kernels)
        self.sharded_sampler = ShardedSampler(model.lm_head, all_gather, self.device, self.sampler.uses_kernel) if (
            all_gather is not None) else None
        self.staging = HostStaging(self.device)
        self.kv_cache: torch.Tensor | None = None
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0
        self.memory_profile: MemoryProfile | None = None
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.timer: StepTimer | None = None  # attach one to record per-step phase times
        self.overlap = StepOverlap(self.device, scheduler_config.max_num_seqs, broadcast)  # submit()'s state

    # ---- KV cache and graphs -----------------------------------------------------------------

    @property
    def block_bytes(self) -> int:
        """Bytes of K and V for one block over all layers."""
        elem = self.kv_dtype.itemsize
        return 2 * self.shape.num_layers * self.block_size * self.num_kv_heads * self.shape.head_dim * elem

    def determine_num_blocks(self, graph_reserve: bool = False, staging_blocks: int = 0) -> int:
        """CacheConfig.num_blocks if set; else sized by profiling (CUDA) or a fixed budget (CPU).

        graph_reserve: keep room for the CUDA-graph pool (set when graphs will be captured).
        staging_blocks: keep room for that many blocks of this cache's layout outside it (a
        disaggregated replica's KV link staging, engine.core.kv_staging).
        """
        if self.cache_config.num_blocks is not None:
            return self.cache_config.num_blocks
        if self.device.type == "cuda":
            profile = profile_memory(self, graph_reserve)
            self.memory_profile = replace(profile, staging_bytes=staging_blocks * self.block_bytes)
            return profiled_kv_blocks(self.memory_profile, self.engine_config.execution.gpu_memory_utilization,
                                      self.block_bytes, self.block_size, self.max_blocks_per_seq)
        return cpu_kv_blocks(self.block_bytes, self.max_blocks_per_seq, self.scheduler_config.max_num_seqs)

    def warm_up(self) -> bool:
        """Run the largest steps once over the allocated cache (engine.kv_sizing.warm_up); False
        when the cache is smaller than one max_model_len sequence."""
        return warm_up(self)

    def free_kv_cache(self) -> None:
        self.graphs = self.prefill_graphs = None  # graphs hold the cache's addresses
        self.kv_caches = []
        self.kv_cache = None
        self.num_blocks = 0

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.free_kv_cache()  # before taking the new one, so that both never coexist
        shape = (self.shape.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.shape.head_dim)
        # Zeros, not empty: padded block-table entries are read (and masked) by some backends,
        # and masked garbage that happens to be NaN would still poison the weighted sum.
        self.kv_cache = torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(self.shape.num_layers)]
        self.num_blocks = num_blocks

    def capture_decode_graphs(self, capture: bool = True) -> None:
        """Decode graphs for batch sizes up to max_num_seqs over the allocated cache
        (engine.runner_graphs). capture=False keeps the padded static-buffer path but runs it
        eagerly (tests on CPU)."""
        capture_decode_graphs(self, capture)

    def capture_prefill_graphs(self, max_tokens: int, capture: bool = True) -> None:
        """Graphs for prefill and mixed steps of up to max_tokens tokens (engine.runner_graphs);
        call before capture_decode_graphs, which then shares their memory pool."""
        capture_prefill_graphs(self, max_tokens, capture)

    # ---- one step ----------------------------------------------------------------------------

    def build_batch(self, plan: StepPlan) -> HostBatch:
        decode_split = (self.num_kv_heads, self.num_sms) if self.balance_decode else None
        batch = build_host_batch(plan, self.block_size, self.max_blocks_per_seq, self.graphs, self.prefill_graphs,
                                 decode_split)
        # NOTE: any rank, not only the driver: each rank builds its own batches of the warm-up
        # steps (engine.kv_sizing), and all must pick the same path for the collectives to match
        if self.sharded_sampler is not None and batch.sample_rows:
            entries = [plan.scheduled[i] for i in batch.sample_rows]
            batch.draw = self.sampler.shard_draw([e.sampling_params for e in entries],
                                                 [e.num_output_tokens for e in entries],
                                                 self.model.lm_head.num_embeddings)
        return batch

    def upload(self, batch: HostBatch) -> ModelInputs:
        return upload_batch(self.staging, batch, self.graphs, self.prefill_graphs)

    def prepare(self, plan: StepPlan) -> ModelInputs:
        return self.upload(self.build_batch(plan))

    def forward(self, inputs: ModelInputs) -> torch.Tensor:  # [token rows, hidden]
        if inputs.graph_size:
            return self.graphs.run(inputs.graph_size, inputs.num_seqs)
        if inputs.prefill_graph:
            return self.prefill_graphs.run(inputs.prefill_graph)
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)

    def _launch(self, batch: HostBatch, plan: StepPlan | None,
                placeholders=None) -> tuple[ModelInputs, torch.Tensor | None]:
        """Queue a built step's device work: upload, placeholder ids (engine.overlap), forward,
        logits and sampling. Returns the inputs and the sampled ids [num_sampled] (None when
        nothing samples, or with plan None when the ranks gather the logits: a non-driver rank
        then computes its slice for the gather and samples nothing)."""
        timer = self.timer
        inputs = self.upload(batch)
        if placeholders is not None:
            self.overlap.fill_placeholders(inputs.input_ids, placeholders, self.staging)
        if timer:
            timer.mark()
        hidden = self.forward(inputs)
        if timer:
            timer.mark()
        if not inputs.sample_rows:
            return inputs, None
        if batch.draw is not None:  # every rank, the same ids
            return inputs, self.sharded_sampler.sample(hidden[inputs.logits_indices], batch.draw)
        logits = step_logits(self.model, hidden, inputs.logits_indices)  # [num_sampled, vocab]
        if plan is None:
            return inputs, None
        return inputs, sample_step(self.sampler, plan, inputs.sample_rows, logits)

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
        inputs, sampled = self._launch(batch, plan)
        if not inputs.sample_rows:
            if timer:
                timer.finish()  # discarded: a step with nothing to sample is not a full record
            return None if plan is None else [-1] * len(plan.scheduled)
        if plan is None:
            return None
        tokens = tokens_per_entry(len(plan.scheduled), inputs.sample_rows, sampled.tolist())
        if timer:
            timer.mark()
            timer.finish(**_timer_fields(batch))
        return tokens

    @torch.inference_mode()
    def submit(self, plan: StepPlan, on_batch: Callable[[HostBatch, Placeholders], None] | None = None
               ) -> PendingTokens:
        """Queue a step on the device and return at once (engine.overlap). Its placeholder inputs
        take the ids the previously submitted step sampled. Driver rank; on_batch sees the built
        batch and its placeholder map first: the driver hands both to the other tensor-parallel
        ranks there, which run them through follow()."""
        timer = self.timer
        if timer:
            timer.mark()
        started = time.perf_counter()
        self.overlap.begin(plan)
        batch = self.build_batch(plan)
        placeholders = self.overlap.placeholders(plan, batch.query_start_loc, batch.input_ids)
        if on_batch is not None:
            on_batch(batch, placeholders)
        start = self.overlap.start_event()
        inputs, sampled = self._launch(batch, plan, placeholders)
        on_done = None
        if timer:
            timer.mark()
            marks, fields = timer.detach(), _timer_fields(batch)
            on_done = lambda: timer.record(*marks, **fields)  # noqa: E731 - once the events are complete
        return self.overlap.finish(plan, inputs.sample_rows, sampled, started, start, on_done,
                                   every_rank_sampled=batch.draw is not None)

    @torch.inference_mode()
    def follow(self, batch: HostBatch, placeholders: Placeholders) -> None:
        """A non-driver tensor-parallel rank's side of submit(): queue the same step, its
        placeholders filled from the previous step's ids, then keep this step's: sampled here
        from the vocabulary slice, or taken from rank 0's broadcast. Returns at once; nothing
        goes back to rank 0."""
        _, sampled = self._launch(batch, None, placeholders)
        self.overlap.receive(len(batch.sample_rows), sampled)


def _timer_fields(batch: HostBatch) -> dict[str, int]:
    return dict(num_seqs=batch.num_seqs, num_tokens=int(batch.input_ids.shape[0]),
                graph_size=batch.graph_size or batch.prefill_graph or 0)
