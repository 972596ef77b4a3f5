"""Float32 torch references for the fused elementwise kernels (rmsnorm, activation, rotary).

Each takes tensors of any supported dtype, computes in float32 and returns float32, so a test
can measure a bf16 kernel's error against the exact result rather than against another rounding.
Importable without Triton.
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., dim] -> x / rms(x) * weight over the last dim, float32."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual), float32."""
    summed = x.float() + residual.float()
    return rms_norm_ref(summed, weight, eps), summed


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, 2 * inter] -> silu(gate) * up, float32."""
    gate, up = x.float().chunk(2, dim=-1)
    return gate * torch.sigmoid(gate) * up


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim]; cos/sin [tokens, head_dim / 2] -> rotate-half rotation, float32."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def qk_norm_rope_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rope(rms_norm(q)), rope(rms_norm(k)) per head (no norm when the weights are None), float32."""
    if q_weight is not None:
        q, k = rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps)
    return rope_ref(q, cos, sin), rope_ref(k, cos, sin)
