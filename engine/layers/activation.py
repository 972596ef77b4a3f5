"""SwiGLU's gate: silu(gate) * up on the fused gate/up projection output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, 2 * intermediate] -> [T, intermediate]
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
