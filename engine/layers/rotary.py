"""Rotary position embedding (the rotate-half form used by Qwen and Llama checkpoints).

cos/sin for every position up to max_position are computed once, in float32, and looked up by
the absolute position of each token, so a token's rotation does not depend on how its sequence
was batched or chunked.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float, device: torch.device | str = "cpu"):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even for rotary embedding")
        self.head_dim = head_dim
        self.max_position = max_position
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
        inv_freq = 1.0 / (theta**exponents)  # [head_dim / 2]
        angles = torch.arange(max_position, device=device).float()[:, None] * inv_freq[None, :]
        self.register_buffer("cos_cache", angles.cos(), persistent=False)  # [max_position, head_dim / 2]
        self.register_buffer("sin_cache", angles.sin(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64 -> (cos, sin), each [T, head_dim / 2] float32."""
        return self.cos_cache[positions], self.sin_cache[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos/sin [T, head_dim / 2]. Rotates (x1, x2) halves pairwise."""
    cos = cos.unsqueeze(1).to(x.dtype)
    sin = sin.unsqueeze(1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
