"""RMSNorm kernels on CUDA against the float32 reference: plain rows, per-head on strided views
(Qwen3's q/k norm), and fused with the residual add; ragged token counts, hidden sizes that are
not powers of two, every I/O dtype."""

from __future__ import annotations

import pytest
import torch

from tests.kernels import fused_cases as cases
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("hidden", [100, 1024, 2560, 4096, 5120])
def test_rms_norm(dtype, tokens, hidden):
    cases.check_rms_norm("cuda", dtype, tokens, hidden, fresh_seed())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("hidden", [100, 1024, 2560, 4096, 5120])
def test_add_rms_norm(dtype, tokens, hidden):
    cases.check_add_rms_norm("cuda", dtype, tokens, hidden, fresh_seed())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 140])
@pytest.mark.parametrize("terms", [2, 8])
@pytest.mark.parametrize("hidden", [64, 2048])
def test_add_rms_norm_sums_terms(dtype, tokens, terms, hidden):
    """x [tokens, terms, hidden]: a mixture-of-experts layer's top-k outputs, summed as they are read."""
    cases.check_add_rms_norm("cuda", dtype, tokens, hidden, fresh_seed(), terms=terms)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 33])
@pytest.mark.parametrize("heads, head_dim", [(16, 128), (8, 128), (3, 64), (32, 64)])
def test_per_head_rms_norm(dtype, tokens, heads, head_dim):
    cases.check_per_head_rms_norm("cuda", dtype, tokens, heads, head_dim, fresh_seed())


def test_rms_norm_rejects_bad_arguments():
    from kernels.rmsnorm import add_rms_norm, rms_norm

    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm(x, torch.ones(32, device="cuda", dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(x, x[:2], torch.ones(64, device="cuda", dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(x.t(), torch.ones(4, device="cuda", dtype=torch.bfloat16), 1e-6)
