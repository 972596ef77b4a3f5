"""Frozen configuration of the engine backend (model, precision, device, kernels).

The scheduler's budgets, the KV-cache geometry and the execution settings shared with the
simulator (ExecutionConfig: graphs, async scheduling, TP size, seed, memory) live in
engine.core.config; this file holds only what the real engine needs on top of them. The harness
builds it from Hydra; LLM() from keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.attention.registry import ATTENTION_BACKENDS
from engine.core.config import ExecutionConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
FUSED_KERNELS = ("off", "triton")
LOAD_FORMATS = ("auto", "dummy")  # engine.dummy
WEIGHT_READS = ("auto", "mapped", "streamed")  # engine.weight_reader


@dataclass(frozen=True)
class EngineConfig:
    """What model to run, where, and how.

    model: a Hugging Face-format checkpoint directory (config.json + safetensors).
    dtype: "auto" is float32 on CPU (bfloat16 matmuls on CPU are slow and lose the precision the
        differential tests need) and the checkpoint's own dtype on CUDA.
    device: "auto" is CUDA when available, else CPU.
    attention_backend: a name in engine.attention.registry.ATTENTION; "auto" resolves there
        (flash_attn, then triton on CUDA; torch everywhere else).
    fused_kernels: "triton" (default) runs fused Triton kernels on CUDA (RMSNorm with the residual
        add, q/k norm with the rotary embedding and the paged-cache store, SiLU-and-mul, one-pass
        Gumbel-max sampling); "off" runs the layers' and the sampler's torch ops (the reference).
        No effect on CPU. Each fused kernel is tested against its torch reference (tests/kernels/);
        fusing saves a kernel launch and a round trip through memory per layer.
    balanced_decode: decode steps cut long contexts into pieces of the batch's mean context for the
        Triton decode kernel (kernels.decode_split), so that a ragged batch costs what an even one
        of the same total does; False cuts every sequence into the same number of pieces.
    load_format: "auto" reads the safetensors weights of the model folder; "dummy" makes random weights
        of the model's shape on the device instead (engine.dummy): model may then be a preset name of
        engine.core.model_shapes.MODEL_SHAPES, and no checkpoint is read or written.
    weight_read: how the safetensors files are read onto the device (engine.weight_reader): "auto"
        is "streamed" onto a GPU (batches read by threads into pinned buffers, copied asynchronously:
        on an H100, 2.3x the bytes/s of "mapped" from the page cache and 1.24x from disk,
        experiments/autoscale/h100_8b/) and "mapped" onto the CPU (tensor by tensor from the
        memory map, no extra copy); "mapped" picks the tensor-by-tensor read on a GPU too.
    record_expert_counts: a mixture-of-experts model counts the tokens routed to each expert of each
        MoE layer on the device (engine.expert_counts; EngineExecutor.take_expert_counts()), from
        which sim.moe.fit_routing_skew measures the routing skew the simulator prices. No effect on
        a dense model.
    execution: CUDA graphs, async scheduling (None: on with CUDA, at any tensor_parallel_size),
        tensor parallelism, seed, memory utilisation (engine.core.config.ExecutionConfig).
    """

    model: str
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    fused_kernels: str = "triton"
    balanced_decode: bool = True
    load_format: str = "auto"
    weight_read: str = "auto"
    record_expert_counts: bool = False
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"EngineConfig.model must be a non-empty path string (or, with load_format='dummy', "
                             f"a preset name), got {self.model!r}")
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice("fused_kernels", self.fused_kernels, FUSED_KERNELS)
        _check_choice("load_format", self.load_format, LOAD_FORMATS)
        _check_choice("weight_read", self.weight_read, WEIGHT_READS)
        if self.weight_read == "streamed" and self.device == "cpu":
            raise ValueError("EngineConfig.weight_read='streamed' reads through pinned memory onto a GPU, "
                             "not with device='cpu'; use 'auto' or 'mapped'")
        for name in ("balanced_decode", "record_expert_counts"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"EngineConfig.{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.execution, ExecutionConfig):
            raise TypeError(f"EngineConfig.execution must be an ExecutionConfig, got {type(self.execution).__name__}")


def _check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"EngineConfig.{field} must be one of {allowed}, got {value!r}")
