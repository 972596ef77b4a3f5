"""Which elementwise kernels the decoder layers run: their own torch ops (the reference, and what a
layer runs until set_fused_kernels says otherwise) or the fused Triton kernels of kernels/
(rmsnorm, activation, rotary, fused_moe).

A layer that can use a fused kernel holds `fused_kernels`: None for the torch path, or a
FusedKernels whose `applies(x)` says whether this input may take the fused path (CUDA tensors;
CPU tensors too when allow_cpu is set, which only makes sense under TRITON_INTERPRET=1 and is
how the CPU tests exercise the wiring). `set_fused_kernels(model, mode, device)` sets it on every
such layer of a model; the runner calls it once, before any CUDA graph is captured.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.config import FUSED_KERNELS as FUSED_KERNEL_MODES


@dataclass(frozen=True)
class FusedKernels:
    rms_norm: Callable[..., torch.Tensor]  # kernels.rmsnorm.rms_norm
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # kernels.rmsnorm.add_rms_norm
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]  # kernels.activation.silu_and_mul
    qk_norm_rope_: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # kernels.rotary.qk_norm_rope_
    allow_cpu: bool = False
    fused_moe: Callable[..., torch.Tensor] | None = None  # kernels.fused_moe.fused_moe_routed
    fused_moe_ids: Callable[..., torch.Tensor] | None = None  # kernels.fused_moe.fused_moe (routed ids in)

    def applies(self, x: torch.Tensor) -> bool:
        return x.is_cuda or self.allow_cpu


class UsesFusedKernels:
    """Marks the layers that have a fused path. Each sets `self.fused_kernels = None` (its torch
    ops) in __init__; set_fused_kernels replaces it."""

    fused_kernels: FusedKernels | None


def _load_fused_kernels(mode: str, allow_cpu: bool) -> FusedKernels | None:
    if mode == "off":
        return None
    # Triton is imported only here: CPU-only installs without it never reach this line.
    from kernels.activation import silu_and_mul
    from kernels.fused_moe import fused_moe, fused_moe_routed
    from kernels.rmsnorm import add_rms_norm, rms_norm
    from kernels.rotary import qk_norm_rope_

    return FusedKernels(rms_norm, add_rms_norm, silu_and_mul, qk_norm_rope_, allow_cpu, fused_moe_routed, fused_moe)


def set_fused_kernels(model: nn.Module, mode: str, device: torch.device | str, allow_cpu: bool = False) -> int:
    """Point every fused-capable layer of `model` at the kernels of `mode` ("off" | "triton").

    On a CPU device the torch path is kept (Triton is not even imported) unless allow_cpu.
    Returns the number of layers that will use fused kernels.
    """
    if mode not in FUSED_KERNEL_MODES:
        raise ValueError(f"fused_kernels must be one of {FUSED_KERNEL_MODES}, got {mode!r}")
    on_cpu = torch.device(device).type != "cuda"
    kernels = None if on_cpu and not allow_cpu else _load_fused_kernels(mode, allow_cpu)
    layers = [m for m in model.modules() if isinstance(m, UsesFusedKernels)]
    for layer in layers:
        layer.fused_kernels = kernels
    return len(layers) if kernels is not None else 0
