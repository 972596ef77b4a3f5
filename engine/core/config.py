"""Frozen configuration of the scheduler core. Hydra builds these at the entry point."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.collectives import ALL_REDUCES
from engine.core.policies import POLICIES as POLICY_REGISTRY

# The names SchedulerConfig.policy takes, as registered by engine.core.policies' built-in policies
# (harness.plan.config checks plan.policies against them).
POLICIES = POLICY_REGISTRY.names()


@dataclass(frozen=True)
class SchedulerConfig:
    """Budgets and policy of the scheduler.

    policy: a name in engine.core.policies.POLICIES: "nano" (a step is all prefill or all decode,
    prefill first), "mixed" (vLLM V1: one token budget, running requests first, then new prefill
    chunks) or "sjf" (mixed, admitting the shortest prompts first).
    max_num_seqs bounds the running set, not only one step's batch: a request that holds
    KV blocks but can never be scheduled would only waste cache.
    """

    policy: str = "nano"
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 16384
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        POLICY_REGISTRY.check(self.policy)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise TypeError(
                f"SchedulerConfig.enable_chunked_prefill must be a bool, got {self.enable_chunked_prefill!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{name} must be a positive int, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "SchedulerConfig.max_num_batched_tokens must be >= max_num_seqs "
                f"({self.max_num_batched_tokens} < {self.max_num_seqs}): a full decode batch must fit the budget"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "SchedulerConfig.max_num_batched_tokens must be >= max_model_len when chunked prefill is off "
                f"({self.max_num_batched_tokens} < {self.max_model_len}): a long prompt could never be scheduled"
            )


# What a KV cache may store: "auto" is the model's own dtype; "fp8" is float8 e4m3 (range +-448),
# written with a scale of 1, as vLLM does when a checkpoint brings no KV scales. Half the bytes of
# bf16, so twice the tokens in the same memory and half the bytes a decode step reads.
KV_CACHE_DTYPES = ("auto", "fp8")


def kv_element_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes of one cached K or V element: the one place both backends size a KV block from."""
    return 1 if kv_cache_dtype == "fp8" else model_dtype_bytes


@dataclass(frozen=True)
class CacheConfig:
    """KV-cache geometry. num_blocks None means "ask the backend" (engine: profiled; sim: planned).
    kv_cache_dtype: one of KV_CACHE_DTYPES."""

    block_size: int = 256
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.enable_prefix_caching, bool):
            raise TypeError(f"CacheConfig.enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"CacheConfig.block_size must be a positive int, got {self.block_size!r}")
        if self.num_blocks is not None and (
            isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) or self.num_blocks < 1
        ):
            raise ValueError(f"CacheConfig.num_blocks must be a positive int or None, got {self.num_blocks!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"CacheConfig.kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")


@dataclass(frozen=True)
class ExecutionConfig:
    """How a backend runs steps; one config for the engine and the simulator alike, so that a
    simulated run mirrors a measured one setting for setting.

    enforce_eager: no CUDA graphs (the engine captures none; the simulator prices every step eager).
    async_scheduling: True plans and queues step N+1 while step N runs on the device, so the
        scheduler and input preparation leave the device's critical path; a request stopped by
        EOS or a stop token then computes one more token, which is discarded. False runs each
        step to completion first. None (auto): on wherever queuing is not executing, a CUDA
        device at any tensor_parallel_size (the simulator stands for a CUDA device).
        overlaps_steps() resolves it; the backend reports the result in BackendInfo.
    prefill_graph_tokens: prefill and mixed steps of up to this many tokens replay CUDA graphs,
        padded to engine.core.graph_sizes' sizes (capped by max_num_batched_tokens); 0: eager.
    max_graph_batch_size: decode steps of up to this many sequences (and max_num_seqs) replay
        CUDA graphs; larger batches run eagerly.
    tensor_parallel_size: ranks the model is split over.
    expert_parallel: a mixture-of-experts model's ranks each hold num_experts / tensor_parallel_size
        whole experts instead of a 1/tensor_parallel_size slice of every expert (attention stays
        tensor-parallel; the same all-reduce sums the ranks' partial outputs). No effect at
        tensor_parallel_size 1; a dense model refuses it (docs/moe.md, docs/moe-pricing.md).
    all_reduce: how ranks sum partial outputs (engine.core.collectives): "nccl", NCCL's ring;
        "symmetric", decode-sized tensors in one-shot launches over symmetric memory, fused with
        the residual add and RMSNorm after them (engine.tp.symmetric; an error where the GPUs
        cannot map each other's memory); "auto" (default), that where it runs, else NCCL. The
        simulator prices the one-shot launches with the hardware's one_shot_* figures.
    seed: seeds the sampling stream of requests that bring no seed of their own.
    gpu_memory_utilization: fraction of device memory the backend may hold (weights,
        activations and the KV cache); the KV cache is sized to fill what is left.
    """

    enforce_eager: bool = False
    async_scheduling: bool | None = None
    prefill_graph_tokens: int = 4096
    max_graph_batch_size: int = 512
    tensor_parallel_size: int = 1
    expert_parallel: bool = False
    all_reduce: str = "auto"
    seed: int = 0
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        for name in ("enforce_eager", "expert_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ExecutionConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise TypeError("ExecutionConfig.async_scheduling must be true, false or null (auto), "
                            f"got {self.async_scheduling!r}")
        for name, low in (("prefill_graph_tokens", 0), ("max_graph_batch_size", 1), ("tensor_parallel_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"ExecutionConfig.{name} must be an int >= {low}, got {value!r}")
        if self.all_reduce not in ALL_REDUCES:
            raise ValueError(f"ExecutionConfig.all_reduce must be one of {ALL_REDUCES}, got {self.all_reduce!r}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"ExecutionConfig.seed must be an int in [0, 2**63), got {seed!r}")
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
            raise ValueError(f"ExecutionConfig.gpu_memory_utilization must be a number in (0, 1], got {util!r}")

    def overlaps_steps(self, on_cuda: bool) -> bool:
        """Whether steps overlap on a backend whose device is (or stands for) CUDA or not."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        # NOTE: on a CPU a step is computed while it is queued, so there is nothing to overlap
        return on_cuda
