"""experiments.kernels.norm_linear_kernel (the folded norm + projection the engine does not use: it
measured slower) on CUDA against its float32 reference, so that its timings in
experiments/norm_linear/ are of a correct kernel: the decoder shapes of Qwen3-0.6B and -8B (qkv;
gate/up with SiLU-and-mul), row counts from one to the largest decode graph, with and without the
residual add, every I/O dtype, and every tile configuration the measurement script tries. The
argument checks run on CPU tensors (they raise before any launch)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.kernels.gpu import needs_cuda
from tests.kernels.norm_linear_cases import check_norm_linear
from tests.kernels.paged_batch import fresh_seed

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


def on_cuda(test):
    for mark in needs_cuda:
        test = mark(test)
    return test

# (dim, projection rows, silu_mul): 0.6B qkv, 0.6B gate/up, 8B qkv, 8B gate/up, a ragged one
SHAPES = [(1024, 4096, False), (1024, 6144, True), (4096, 6144, False), (4096, 24576, True), (1000, 200, True)]


@on_cuda
@pytest.mark.parametrize("rows", [1, 7, 64, 140, 512])
@pytest.mark.parametrize("dim, out_rows, silu_mul", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_linear_matches_reference(rows, dim, out_rows, silu_mul, with_residual):
    check_norm_linear("cuda", torch.bfloat16, rows, dim, out_rows, with_residual, silu_mul, fresh_seed())


@on_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [3, 140])
@pytest.mark.parametrize("silu_mul", [False, True])
def test_norm_linear_in_other_dtypes(dtype, rows, silu_mul):
    check_norm_linear("cuda", dtype, rows, 1024, 512, True, silu_mul, fresh_seed())


@on_cuda
def test_every_measured_tile_configuration_is_correct():
    from experiments.kernels.norm_linear import CANDIDATE_CONFIGS

    for config in CANDIDATE_CONFIGS:
        for rows in (1, 140):
            check_norm_linear("cuda", torch.bfloat16, rows, 1024, 6144, True, True, fresh_seed(), config=dict(config))


@needs_triton
def test_norm_linear_rejects_bad_arguments():
    from experiments.kernels.norm_linear_kernel import MAX_ROWS, norm_linear

    x, g, w = torch.randn(4, 64), torch.ones(64), torch.randn(32, 64)
    with pytest.raises(ValueError, match="at most"):
        norm_linear(torch.randn(MAX_ROWS + 1, 64), None, g, w, 1e-6)
    with pytest.raises(ValueError, match="weight \\[out, dim\\]"):
        norm_linear(x, None, g, torch.randn(32, 65), 1e-6)
    with pytest.raises(ValueError, match="residual must match"):
        norm_linear(x, torch.randn(3, 64), g, w, 1e-6)
    with pytest.raises(ValueError, match="even row count"):
        norm_linear(x, None, g, torch.randn(33, 64), 1e-6, silu_mul=True)
    with pytest.raises(TypeError, match="share a dtype"):
        norm_linear(x, None, g, w.double(), 1e-6)
