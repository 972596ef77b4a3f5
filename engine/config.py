"""Frozen configuration of the engine backend (model, precision, device, kernels).

The scheduler's budgets and the KV-cache geometry live in engine.core.config; this file holds
only what the real engine needs on top of them. The harness builds it from Hydra; LLM() from
keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
FUSED_KERNELS = ("off", "triton")
ASYNC_SCHEDULING = ("auto", "on", "off")


@dataclass(frozen=True)
class EngineConfig:
    """What model to run, where, and how.

    model: a Hugging Face-format checkpoint directory (config.json + safetensors).
    dtype: "auto" is float32 on CPU (bfloat16 matmuls on CPU are slow and lose the precision the
        differential tests need) and the checkpoint's own dtype on CUDA.
    device: "auto" is CUDA when available, else CPU.
    attention_backend: "auto" resolves in engine.attention (flash_attn, then triton on CUDA;
        torch everywhere else).
    enforce_eager: disable CUDA-graph capture (no effect on CPU).
    gpu_memory_utilization: fraction of device memory the engine may hold (weights, activations
        and the KV cache); the KV cache is sized to fill what is left.
    seed: seeds the sampling stream of requests that bring no seed of their own.
    fused_kernels: "triton" (default) runs fused Triton kernels on CUDA (RMSNorm with the residual
        add, q/k norm with the rotary embedding, SiLU-and-mul, one-pass Gumbel-max sampling);
        "off" runs the layers' and the sampler's torch ops (the reference). No effect on CPU.
        Verified and measured on H100 in experiments/fused/h100_run1/ (10.5k -> 15.9k tok/s).
    async_scheduling: "on" plans and queues step N+1 while step N runs on the device, so the
        scheduler and the input preparation are off the device's critical path
        (engine.core.loop, engine.overlap); "auto" (default) turns it on on CUDA with
        tensor_parallel_size 1; "off" runs each step to completion first. A request stopped by
        EOS or a stop token then computes one more token, which is discarded.
    prefill_graph_tokens: prefill and mixed steps of up to this many tokens replay CUDA graphs
        captured at the sizes of engine.core.graph_sizes (padded; Triton attention only, none
        with enforce_eager); 0 runs them eagerly, where a small one is bound by its Python
        launches (engine.prefill_graphs). Capped by max_num_batched_tokens.
    balanced_decode: decode steps cut long contexts into pieces of the batch's mean context for the
        Triton decode kernel (kernels.decode_split), so that a ragged batch costs what an even one
        of the same total does; False cuts every sequence into the same number of pieces.
    """

    model: str
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    enforce_eager: bool = False
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    seed: int = 0
    fused_kernels: str = "triton"
    async_scheduling: str = "auto"
    prefill_graph_tokens: int = 4096
    balanced_decode: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"EngineConfig.model must be a non-empty path string, got {self.model!r}")
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice("fused_kernels", self.fused_kernels, FUSED_KERNELS)
        _check_choice("async_scheduling", self.async_scheduling, ASYNC_SCHEDULING)
        if not isinstance(self.enforce_eager, bool):
            raise TypeError(f"EngineConfig.enforce_eager must be a bool, got {type(self.enforce_eager).__name__}")
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
            raise ValueError(f"EngineConfig.gpu_memory_utilization must be a number in (0, 1], got {util!r}")
        tp = self.tensor_parallel_size
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"EngineConfig.tensor_parallel_size must be an int >= 1, got {tp!r}")
        if self.async_scheduling == "on" and tp > 1:
            raise ValueError("EngineConfig.async_scheduling='on' needs tensor_parallel_size=1 (the other ranks "
                             f"would need the sampled ids before each step), got tensor_parallel_size={tp}")
        pg = self.prefill_graph_tokens
        if isinstance(pg, bool) or not isinstance(pg, int) or pg < 0:
            raise ValueError(f"EngineConfig.prefill_graph_tokens must be an int >= 0 (0: eager prefill), got {pg!r}")
        if not isinstance(self.balanced_decode, bool):
            raise TypeError(f"EngineConfig.balanced_decode must be a bool, got {type(self.balanced_decode).__name__}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"EngineConfig.seed must be an int in [0, 2**63), got {seed!r}")


def _check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"EngineConfig.{field} must be one of {allowed}, got {value!r}")
