"""SiLU-and-mul kernel on CUDA against the float32 reference (intermediate sizes of Qwen3 models
and ragged ones, every I/O dtype)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels import fused_cases as cases
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 5, 257])
@pytest.mark.parametrize("inter", [17, 1000, 3072, 9728, 12288])
def test_silu_and_mul(dtype, tokens, inter):
    cases.check_silu_and_mul("cuda", dtype, tokens, inter, fresh_seed())


def test_silu_and_mul_rejects_odd_width():
    from kernels.activation import silu_and_mul

    with pytest.raises(ValueError, match="2 \\* intermediate"):
        silu_and_mul(torch.randn(3, 7, device="cuda"))
