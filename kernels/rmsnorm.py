"""RMSNorm in one pass per row, optionally fused with the residual add before it.

`rms_norm(x, weight, eps)` normalises the last dimension of a [rows, dim] or [tokens, heads, dim]
tensor (the per-head q/k norm of Qwen3 is the 3-D case, on strided views of the fused qkv
output). `add_rms_norm(x, residual, weight, eps)` returns (norm(x + residual), x + residual): a
pre-norm block's residual add and the next norm read x and residual once and write two outputs,
where the unfused path launches ~9 kernels and makes ~6 passes over [tokens, hidden]. x may
also be [tokens, terms, dim], a sum the kernel takes as it reads it (a mixture-of-experts layer's
top-k outputs: one launch and one pass fewer than summing them first).

Math in float32 whatever the I/O dtype (bf16, fp16, fp32). The residual sum is rounded to the
I/O dtype before its statistics are taken, so the normalised output is exactly the norm of the
stream that is passed on. Outputs are fresh tensors of the input's shape and dtype; nothing here
reads a device value on the host, so the calls can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.validation import SUPPORTED_DTYPES

# One program holds a whole row in registers; 32k float32 values is far past any decoder's hidden
# size (Qwen3-32B: 5120) and still compiles.
MAX_DIM = 32768


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_xt,
    stride_xh,
    stride_rt,
    stride_ot,
    stride_oh,
    stride_rot,
    dim,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    TERMS: tl.constexpr = 1,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    x = tl.load(x_ptr + tok * stride_xt + head * stride_xh + cols, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, TERMS):  # x's terms (stride_xh apart) summed in float32
        x += tl.load(x_ptr + tok * stride_xt + j * stride_xh + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + tok * stride_rt + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + tok * stride_rot + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / dim + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _num_warps(block: int) -> int:
    return max(1, min(16, block // 256))


def _check(x: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    if x.dim() not in (2, 3):
        raise ValueError(f"{what}: x must be [rows, dim] or [tokens, heads, dim], got {tuple(x.shape)}")
    dim = x.shape[-1]
    if weight.shape != (dim,):
        raise ValueError(f"{what}: weight must be [{dim}] like x's last dimension, got {tuple(weight.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what}: dtypes must be in {SUPPORTED_DTYPES}, got x {x.dtype}, weight {weight.dtype}")
    if x.stride(-1) != 1 or weight.stride(0) != 1:
        raise ValueError(f"{what}: x and weight must be contiguous in their last dimension")
    if not 1 <= dim <= MAX_DIM:
        raise ValueError(f"{what}: the normalised dimension must be in [1, {MAX_DIM}], got {dim}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, dim] or [tokens, heads, dim] (last dim contiguous) -> same shape, contiguous."""
    _check(x, weight, "rms_norm")
    x3 = x if x.dim() == 3 else x.unsqueeze(1)  # [tokens, heads, dim]
    out = torch.empty(x3.shape, dtype=x.dtype, device=x.device)
    tokens, heads, dim = x3.shape
    if tokens and heads:
        block = triton.next_power_of_2(dim)
        _rms_norm_kernel[(tokens, heads)](
            x3, x3, weight, out, out,
            x3.stride(0), x3.stride(1), 0, out.stride(0), out.stride(1), 0,
            dim, eps, HAS_RESIDUAL=False, BLOCK=block, num_warps=_num_warps(block),
        )
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor,  # [rows, dim], or [rows, terms, dim]: summed over terms first
    residual: torch.Tensor,  # [rows, dim]
    weight: torch.Tensor,  # [dim]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual), both [rows, dim] in x's dtype. A 3-D x is a sum still
    to be taken (a mixture-of-experts layer's k weighted expert outputs per token), added in
    float32 as it is read."""
    _check(x, weight, "add_rms_norm")
    rows, dim = x.shape[0], x.shape[-1]
    if residual.shape != (rows, dim) or residual.dtype != x.dtype or residual.stride(-1) != 1:
        raise ValueError(
            f"add_rms_norm: x must be [rows, dim] or [rows, terms, dim] and residual [rows, dim], of one dtype, "
            f"last dim contiguous; got {tuple(x.shape)} {x.dtype} and {tuple(residual.shape)} {residual.dtype}"
        )
    out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    res_out = torch.empty_like(residual, memory_format=torch.contiguous_format)
    terms = x.shape[1] if x.dim() == 3 else 1
    if rows:
        block = triton.next_power_of_2(dim)
        _rms_norm_kernel[(rows, 1)](
            x, residual, weight, out, res_out,
            x.stride(0), x.stride(1) if terms > 1 else 0, residual.stride(0), out.stride(0), 0, res_out.stride(0),
            dim, eps, HAS_RESIDUAL=True, BLOCK=block, TERMS=terms, num_warps=_num_warps(block),
        )
    return out, res_out
