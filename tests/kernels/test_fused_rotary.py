"""q/k RMSNorm + rotary kernel on CUDA: in place on views of a fused qkv buffer, against the
float32 reference, with and without the norm, GQA head counts, head_dim 64 and 128, positions up
to 40k, every I/O dtype; v and the rest of the buffer must stay untouched."""

from __future__ import annotations

import pytest
import torch

from tests.kernels import fused_cases as cases
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 19, 300])
@pytest.mark.parametrize("heads, kv_heads", [(16, 8), (32, 8), (14, 2), (5, 5)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("with_norm", [True, False])
def test_qk_norm_rope(dtype, tokens, heads, kv_heads, head_dim, with_norm):
    cases.check_qk_norm_rope("cuda", dtype, tokens, heads, kv_heads, head_dim, with_norm, fresh_seed())


def test_qk_norm_rope_rejects_bad_arguments():
    from kernels.rotary import qk_norm_rope_

    q = torch.randn(3, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(3, 2, 64, device="cuda", dtype=torch.bfloat16)
    cos = torch.randn(3, 32, device="cuda")
    with pytest.raises(ValueError, match="cos must be"):
        qk_norm_rope_(q, k, cos[:2], cos[:2])
    with pytest.raises(ValueError, match="together"):
        qk_norm_rope_(q, k, cos, cos, torch.ones(64, device="cuda", dtype=torch.bfloat16), None)
    with pytest.raises(TypeError, match="share a dtype"):
        qk_norm_rope_(q, k.float(), cos, cos)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cache", ["model", "fp8"])
@pytest.mark.parametrize("tokens", [3, 300])
def test_qk_norm_rope_stores_what_store_kvcache_stores(dtype, cache, tokens):
    cache_dtype = dtype if cache == "model" else torch.float8_e4m3fn
    cases.check_qk_norm_rope_store("cuda", dtype, cache_dtype, tokens, fresh_seed())
