"""An experiment that lost (experiments/norm_linear/README.md): a pre-norm block's RMSNorm (with the
residual add before it) folded into the projection after it, and for the MLP also the SwiGLU gate
after that, as one Triton kernel where the engine's decode step runs three.

    norm_linear(x, residual, g, W)                -> (rms_norm(x + residual) * g @ W.T, x + residual)
    norm_linear(x, residual, g, W, silu_mul=True) -> (silu(h @ Wg.T) * (h @ Wu.T), x + residual)

with h = rms_norm(x + residual) * g and W = [Wg; Wu] stacked by rows (MergedColumnParallelLinear's
layout). The norm's row statistic is a per-row scalar, so it factors out of the dot product:
each program accumulates (x * g) @ W.T and the row's sum of squares in the same pass over K and
scales by 1 / rms at the end. The programs of the first column tile write the residual sum,
which every program recomputes from x and residual.

On an H100 it took 1.7-4.2x the time of the kernels it replaces (cuBLAS GEMMs among them) with
its best tiles, up to 10x with its default tiles, so the engine does not use it. Rounding differs
from the unfused path by one rounding: x * g is rounded to the weight's dtype before the dot
product, where the unfused path rounds x / rms first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.validation import SUPPORTED_DTYPES

# Decode-sized row counts only (the engine's decode graphs go up to 512 rows).
MAX_ROWS = 512


# One compiled kernel for every row count, as an engine serving ragged eager steps would need.
@triton.jit(do_not_specialize=["rows"])
def _norm_linear_kernel(
    x_ptr, res_ptr, res_out_ptr, g_ptr, w_ptr, out_ptr,
    rows, n_out, eps,
    stride_xm, stride_rm, stride_rom, stride_wn, stride_om,
    DIM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SILU_MUL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Row tiles vary fastest, so the programs that share a weight tile run together and the
    # weight is read from memory about once.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = m < rows
    n_ok = n < n_out
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    sum_sq = tl.zeros([BLOCK_M], tl.float32)
    m64 = m.to(tl.int64)
    n64 = n.to(tl.int64)
    for k0 in range(0, DIM, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < DIM
        a_mask = m_ok[:, None] & k_ok[None, :]
        a = tl.load(x_ptr + m64[:, None] * stride_xm + k[None, :], mask=a_mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + m64[:, None] * stride_rm + k[None, :], mask=a_mask, other=0.0)
            summed = (a + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            if pid_n == 0:
                tl.store(res_out_ptr + m64[:, None] * stride_rom + k[None, :], summed, mask=a_mask)
            a = summed.to(tl.float32)
        sum_sq += tl.sum(a * a, axis=1)
        g = tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        a_g = (a * g[None, :]).to(w_ptr.dtype.element_ty)
        w_mask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptr + n64[:, None] * stride_wn + k[None, :], mask=w_mask, other=0.0)
        acc += tl.dot(a_g, tl.trans(w), input_precision=DOT_PRECISION)
        if SILU_MUL:
            w_up = tl.load(w_ptr + (n64 + n_out)[:, None] * stride_wn + k[None, :], mask=w_mask, other=0.0)
            acc_up += tl.dot(a_g, tl.trans(w_up), input_precision=DOT_PRECISION)
    rstd = 1.0 / tl.sqrt(sum_sq / DIM + eps)
    y = acc * rstd[:, None]
    if SILU_MUL:
        y = y / (1.0 + tl.exp(-y)) * (acc_up * rstd[:, None])
    dst = out_ptr + m64[:, None] * stride_om + n[None, :]
    tl.store(dst, y.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def tile_config(rows: int, n_out: int, silu_mul: bool, element_bytes: int) -> dict[str, int]:
    """Tile sizes, warps and pipeline depth for one call's shape (experiments/kernels/norm_linear.py
    measures the alternatives); float32 tiles get fewer stages to fit in shared memory."""
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    block_n = 32 if n_out <= 4096 or silu_mul else 64
    stages = 4 if element_bytes <= 2 else 2
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 128, "num_warps": 4, "num_stages": stages}


def _check(x, residual, norm_weight, weight, silu_mul) -> None:
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"norm_linear: x must be [rows, dim] and weight [out, dim], got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"norm_linear: norm_weight must be [{x.shape[1]}], got {tuple(norm_weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"norm_linear: residual must match x ({tuple(x.shape)} {x.dtype}), got "
                         f"{tuple(residual.shape)} {residual.dtype}")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype or norm_weight.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"norm_linear: x and weight must share a dtype in {SUPPORTED_DTYPES}, got {x.dtype}, "
                        f"{weight.dtype} (norm weight {norm_weight.dtype})")
    if silu_mul and weight.shape[0] % 2:
        raise ValueError(f"norm_linear: silu_mul needs [gate; up] with an even row count, got {weight.shape[0]}")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"norm_linear: at most {MAX_ROWS} rows (a vendor GEMM is faster beyond), got {x.shape[0]}")
    tensors = (x, weight, norm_weight) if residual is None else (x, weight, norm_weight, residual)
    if any(t.stride(-1) != 1 for t in tensors):
        raise ValueError("norm_linear: x, residual and both weights must be contiguous in their last dimension")


def norm_linear(
    x: torch.Tensor,  # [rows, dim]
    residual: torch.Tensor | None,  # [rows, dim]; None: x is the stream itself (first layer)
    norm_weight: torch.Tensor,  # [dim]
    weight: torch.Tensor,  # [out, dim]; with silu_mul [gate; up], 2 * inter rows
    eps: float,
    silu_mul: bool = False,
    config: dict[str, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(projection of the normalised stream, the stream): see the module docstring. The stream is
    x itself when residual is None. `config` overrides tile_config (for measurements)."""
    _check(x, residual, norm_weight, weight, silu_mul)
    rows, dim = x.shape
    n_out = weight.shape[0] // 2 if silu_mul else weight.shape[0]
    out = torch.empty((rows, n_out), dtype=x.dtype, device=x.device)
    stream = x if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows == 0:
        return out, stream
    cfg = config or tile_config(rows, n_out, silu_mul, x.element_size())
    tiles = dict(cfg)
    warps, stages = tiles.pop("num_warps"), tiles.pop("num_stages")
    grid = (triton.cdiv(rows, tiles["BLOCK_M"]), triton.cdiv(n_out, tiles["BLOCK_N"]))
    has_res = residual is not None
    _norm_linear_kernel[grid](
        x, residual if has_res else x, stream, norm_weight, weight, out,
        rows, n_out, eps,
        x.stride(0), residual.stride(0) if has_res else 0, stream.stride(0), weight.stride(0), out.stride(0),
        DIM=dim, HAS_RESIDUAL=has_res, SILU_MUL=silu_mul,
        # float32 models get float32 products (tf32 would round the inputs to 10 bits)
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages, **tiles,
    )  # fmt: skip
    return out, stream
