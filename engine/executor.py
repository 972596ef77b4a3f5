"""EngineExecutor: the real model behind the core's Executor protocol.

It resolves device, dtype and attention backend, loads the checkpoint, sizes and allocates the
KV cache (by profiling on CUDA), captures the decode CUDA graphs, and times each step on the
wall clock (synchronising CUDA, so the time is the step's, not the launch's).

With tensor_parallel_size > 1 this process is rank 0 on cuda:0 and drives one spawned worker
process per other rank (engine.tp): every rank loads its shard, profiles, allocates the same
number of blocks (the smallest any rank can hold) and captures the same graphs; each step's
HostBatch goes to the workers before rank 0 runs it, with the step's draw when every rank samples
its slice of the vocabulary (engine.sharded_sampling; otherwise rank 0 alone samples). Overlapped
steps (async scheduling, the default on CUDA) work the same way: the batch goes out with its
placeholder map, and every rank holds the ids the next step needs (engine.overlap); rank 0 waits
on no worker per step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from engine.attention import get_attention_backend
from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.executor import BackendInfo, PendingStep, StepHook, StepHooks, Unobserve
from engine.core.plan import StepPlan, StepResult
from engine.dummy import dummy_model_folder
from engine.expert_counts import ExpertCounts
from engine.graph_use import captured_graph_sizes, graphs_detached
from engine.kv_sizing import kv_cache_torch_dtype
from engine.preflight import (
    check_max_model_len,
    check_tensor_parallel,
    describe_device,
    has_tokenizer,
    read_eos_token_ids,
    resolve_device,
)
from engine.rank import build_runner, engine_dtype
from engine.runner import ModelRunner

log = logging.getLogger(__name__)

# How long rank 0 waits for a worker's answer, and torch.distributed's collective timeout.
TP_TIMEOUT_S = 600.0


class _Laps:
    """Writes the seconds since the previous lap (the device's work finished) under each name."""

    def __init__(self, into: dict[str, float], device: torch.device) -> None:
        self.into = into
        self.device = device
        self.mark = time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.into[name] = now - self.mark
        self.mark = now


class EngineExecutor:
    def __init__(self, engine_config: EngineConfig, scheduler_config: SchedulerConfig,
                 cache_config: CacheConfig, kv_staging_blocks: int = 0) -> None:
        """kv_staging_blocks: blocks of this cache's layout kept free beside it when the cache is
        sized (a disaggregated replica's KV link staging: engine.core.kv_staging)."""
        if engine_config.load_format == "dummy":  # a preset name becomes a weightless model folder
            engine_config = replace(engine_config, model=dummy_model_folder(engine_config.model, self))
        check_max_model_len(engine_config, scheduler_config)
        self.config = engine_config
        self.runner: ModelRunner | None = None
        self.workers = None
        self.group = None
        device = resolve_device(engine_config.device)
        execution = engine_config.execution
        tp = execution.tensor_parallel_size
        if tp > 1:
            check_tensor_parallel(engine_config, device)
            if device.type == "cuda":
                device = torch.device("cuda", 0)
        self.device = device
        backend = get_attention_backend(engine_config.attention_backend, device, cache_config.block_size,
                                        kv_cache_torch_dtype(cache_config.kv_cache_dtype,
                                                             engine_dtype(engine_config, device)))
        self.attention_backend = backend.name
        self._spin_cycles_per_s: float | None = None  # hold_device's calibration
        self._hooks = StepHooks()
        self.uses_cuda_graphs = (device.type == "cuda" and not execution.enforce_eager
                                 and backend.supports_decode_graphs())
        self.prefill_graph_tokens = execution.prefill_graph_tokens if (
            self.uses_cuda_graphs and backend.supports_prefill_graphs()) else 0
        if device.type == "cuda" and not execution.enforce_eager and not self.uses_cuda_graphs:
            log.warning("attention backend %r cannot be captured in a CUDA graph: decode steps run eagerly",
                        backend.name)
        # seconds of each start-up phase (an autoscaled fleet's cold start is calibrated from them)
        self.startup_s: dict[str, float] = {}
        self.kv_staging_blocks = kv_staging_blocks
        try:
            self._start(scheduler_config, cache_config)
        except BaseException:
            self.shutdown()
            raise
        # the part of the load lap that read the checkpoint's weights (None: dummy weights)
        self.weights_load_s: float | None = self.runner.model.weights_load_s
        self.hf_config = self.runner.hf_config
        self._tokenizer = None
        self._has_tokenizer = has_tokenizer(engine_config.model)  # once: every output asks for the tokenizer
        eos_token_ids = read_eos_token_ids(engine_config.model, self.hf_config)
        if not eos_token_ids and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            eos_token_ids = (self.tokenizer.eos_token_id,)
        all_reduce = "" if self.group is None else "nccl" if self.group.symmetric is None else "symmetric"
        self._info = BackendInfo(self.runner.num_blocks, self.runner.block_size, self.runner.shape.vocab_size,
                                 eos_token_ids, execution.overlaps_steps(device.type == "cuda"),
                                 captured_graph_sizes(self.runner), describe_device(device, self.runner.dtype),
                                 all_reduce)

    def _start(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        """Spawn the workers, load, size and allocate the KV cache, capture the graphs and warm up,
        timing each phase into startup_s."""
        engine_config, device = self.config, self.device
        lap = _Laps(self.startup_s, device)
        if engine_config.execution.tensor_parallel_size > 1:
            self._start_workers(scheduler_config, cache_config)
        self.runner = build_runner(engine_config, scheduler_config, cache_config, device, self.group)
        if self.workers:
            self.workers.replies("load")
            self.workers.send("profile", (self.uses_cuda_graphs, self.kv_staging_blocks))
        lap("load")
        num_blocks = self.runner.determine_num_blocks(self.uses_cuda_graphs, self.kv_staging_blocks)
        if self.workers:
            num_blocks = min([num_blocks, *self.workers.replies("profile")])
            self.workers.send("allocate", num_blocks)
        self.runner.allocate_kv_cache(num_blocks)
        if self.workers:
            self.workers.replies("allocate")
        lap("kv_cache")
        if self.uses_cuda_graphs:
            self._capture_graphs()
        lap("capture")
        # a given block count skipped the profiling steps that compile the kernels
        if device.type == "cuda" and cache_config.num_blocks is not None and not self.workers:
            if not self.runner.warm_up():
                log.warning("cache of %d blocks is smaller than one max_model_len sequence: no warm-up; "
                            "the first steps will include kernel compilation", num_blocks)
        lap("warm_up")

    def _capture_graphs(self) -> None:
        start = time.perf_counter()
        if self.workers:
            self.workers.send("capture", self.prefill_graph_tokens)
        if self.prefill_graph_tokens:
            self.runner.capture_prefill_graphs(self.prefill_graph_tokens)
        self.runner.capture_decode_graphs()
        if self.workers:
            self.workers.replies("capture")
        prefill = self.runner.prefill_graphs
        log.info("captured %d decode CUDA graphs (batch sizes up to %d) and %d prefill graphs (up to %d "
                 "tokens) in %.1f s", len(self.runner.graphs.sizes), self.runner.graphs.max_batch,
                 len(prefill.sizes) if prefill else 0, prefill.max_tokens if prefill else 0,
                 time.perf_counter() - start)

    def _start_workers(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        from engine.tp import DistGroup, Workers, free_port
        from engine.tp.group import apply_safe_env
        from engine.tp.workers import WorkerSpec

        cfg = self.config
        apply_safe_env()  # before the spawn: children inherit it
        port = free_port()
        tp = cfg.execution.tensor_parallel_size
        specs = [WorkerSpec(rank, tp, port, cfg, scheduler_config, cache_config,
                            self.device.type, TP_TIMEOUT_S, torch.get_num_threads())
                 for rank in range(1, tp)]
        self.workers = Workers(specs)
        self.workers.replies("start")  # every worker imported its stack and is about to join
        self.group = DistGroup(0, tp, port, self.device, TP_TIMEOUT_S, cfg.execution.all_reduce)

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer, loaded on first use (token-id workloads never need it); None
        for a folder without one (engine.preflight.has_tokenizer)."""
        if self._tokenizer is None and self._has_tokenizer:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        return self._tokenizer

    def info(self) -> BackendInfo:
        return self._info

    def take_expert_counts(self) -> ExpertCounts | None:
        """Tokens routed to each expert of each MoE layer since the last call (engine.expert_counts),
        then zero again; None unless EngineConfig.record_expert_counts is on for an MoE model. Rank 0's
        counts: every tensor-parallel rank routes alike."""
        counter = self.runner.expert_counter if self.runner is not None else None
        return counter.take() if counter is not None else None

    def observe(self, hook: StepHook) -> Unobserve:
        return self._hooks.add(hook)

    def execute(self, plan: StepPlan) -> StepResult:
        if self.runner is None:
            raise RuntimeError("EngineExecutor.execute() after shutdown()")
        return self._hooks.executed(plan, self._run_step)

    def _run_step(self, plan: StepPlan) -> StepResult:
        start = time.perf_counter()
        with graphs_detached(self.runner, not plan.use_cuda_graphs):
            tokens = self.runner.execute(plan, self.workers.send_batch if self.workers else None)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(tokens, time.perf_counter() - start)

    def hold_device(self, seconds: float) -> bool:
        """Queue a spin of about `seconds` on the device and return True (False on CPU, where
        nothing is queued). Profiling uses it to time a step's device work alone: launched
        behind the spin, the step's kernels are all queued before the device reaches them."""
        if self.device.type != "cuda":
            return False
        if self._spin_cycles_per_s is None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            end.synchronize()
            self._spin_cycles_per_s = 10_000_000 / (start.elapsed_time(end) / 1e3)
        torch.cuda._sleep(int(seconds * self._spin_cycles_per_s))
        return True

    def submit(self, plan: StepPlan) -> PendingStep:
        """Queue the step and return a PendingTokens (engine.overlap); the loop uses this when
        info().overlaps_steps is True."""
        if self.runner is None:
            raise RuntimeError("EngineExecutor.submit() after shutdown()")
        return self._hooks.submitted(plan, self._queue_step)

    def _queue_step(self, plan: StepPlan) -> PendingStep:
        with graphs_detached(self.runner, not plan.use_cuda_graphs):
            return self.runner.submit(plan, self.workers.submit_batch if self.workers else None)

    def shutdown(self) -> None:
        """Release the KV cache, the weights and the workers; no steps can run afterwards."""
        if self.runner is not None:
            self.runner.free_kv_cache()
            self.runner = None
        if self.workers is not None:
            group, self.group = self.group, None
            self.workers.close(group.destroy if group is not None else None)
            self.workers = None
        if self.group is not None:
            self.group.destroy()
            self.group = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
