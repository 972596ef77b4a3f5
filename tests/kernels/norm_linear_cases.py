"""Checks of experiments.kernels.norm_linear_kernel against its float32 reference, shared by the
GPU tests (test_norm_linear.py) and the CPU interpreter run (interpret_fused.py, float32).

Inputs are fresh random tensors per call; the seed is in every failure message. Rows get very
different scales, so a kernel that normalised by the wrong row (or not at all) fails.
"""

from __future__ import annotations

import torch

from kernels.elementwise_reference import rms_norm_ref, silu_and_mul_ref
from tests.kernels.fused_cases import assert_close_rel


def norm_linear_ref(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    silu_mul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(projection of rms_norm(x + residual), x + residual) as the kernel, float32; with
    silu_mul the projection is [gate; up] and silu(gate) * up is returned."""
    stream = x.float() if residual is None else x.float() + residual.float()
    projected = rms_norm_ref(stream, norm_weight, eps) @ weight.float().T
    return (silu_and_mul_ref(projected) if silu_mul else projected), stream


def check_norm_linear(device: str, dtype: torch.dtype, rows: int, dim: int, out_rows: int, with_residual: bool,
                      silu_mul: bool, seed: int, config: dict[str, int] | None = None) -> None:
    from experiments.kernels.norm_linear_kernel import norm_linear

    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    row_scales = torch.logspace(-1, 1, rows).to(dtype).to(device)[:, None]
    x = randn(rows, dim) * row_scales
    residual = randn(rows, dim, scale=3.0) * row_scales if with_residual else None
    norm_weight = randn(dim, scale=0.2) + 1
    weight = randn(out_rows, dim, scale=dim**-0.5)
    before = [t.clone() for t in (x, residual) if t is not None]
    out, stream = norm_linear(x, residual, norm_weight, weight, 1e-6, silu_mul=silu_mul, config=config)
    ref_out, ref_stream = norm_linear_ref(x, residual, norm_weight, weight, 1e-6, silu_mul)
    what = f"norm_linear {rows}x{dim} -> {out_rows} residual={with_residual} silu_mul={silu_mul} {dtype} seed {seed}"
    assert out.shape == (rows, out_rows // 2 if silu_mul else out_rows) and out.dtype == dtype, what
    assert_close_rel(stream, ref_stream, dtype, what + " (stream)")
    assert_close_rel(out, ref_out, dtype, what)
    assert all(torch.equal(t, b) for t, b in zip((x, residual), before) if t is not None), what + ": inputs changed"
    if residual is None:
        assert stream is x, what + ": without a residual the stream is x itself"
