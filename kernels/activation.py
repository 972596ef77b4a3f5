"""SwiGLU's gate in one pass: silu(gate) * up from the fused gate/up projection output.

x is [tokens, 2 * inter] with gate in the first half of each row and up in the second (the layout
of MergedColumnParallelLinear's [gate; up] weight). The unfused path reads x twice and writes
three [tokens, inter] tensors (chunk views, silu, product); this reads x once and writes the
result once. Math in float32; one rounding to the I/O dtype at the end. CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.validation import SUPPORTED_DTYPES

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_xt, stride_ot, inter, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + tok * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + tok * stride_xt + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + tok * stride_ot + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [tokens, 2 * inter] -> [tokens, inter] = silu(x[:, :inter]) * x[:, inter:]."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_and_mul: x must be [tokens, 2 * intermediate], got {tuple(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"silu_and_mul: x.dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("silu_and_mul: x must be contiguous in its last dimension")
    tokens, inter = x.shape[0], x.shape[1] // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    if tokens and inter:
        _silu_and_mul_kernel[(tokens, triton.cdiv(inter, BLOCK))](
            x, out, x.stride(0), out.stride(0), inter, BLOCK=BLOCK, num_warps=4,
        )
    return out
