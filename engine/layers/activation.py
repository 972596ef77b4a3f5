"""SwiGLU's gate: silu(gate) * up on the fused gate/up projection output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.fused import UsesFusedKernels


class SiluAndMul(nn.Module, UsesFusedKernels):
    def __init__(self) -> None:
        super().__init__()
        self.fused_kernels = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, 2 * intermediate] -> [T, intermediate]
        fused = self.fused_kernels
        if fused is not None and fused.applies(x):
            return fused.silu_and_mul(x)  # one read of x, one write
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
