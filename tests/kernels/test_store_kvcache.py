from __future__ import annotations

import pytest
import torch

from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 64), (2, 128), (8, 128), (3, 64)])
@pytest.mark.parametrize("block_size", [16, 256])
def test_store_writes_only_mapped_slots(dtype, num_kv_heads, head_dim, block_size):
    from kernels.store_kvcache import store_kvcache

    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    num_tokens = 300
    num_blocks = -(-2 * num_tokens // block_size)  # about half the slots get written
    num_slots = num_blocks * block_size
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device="cuda")  # poison
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    # k and v as strided views of one fused qkv-like buffer, as the model produces them
    fused = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=gen).to(dtype).cuda()
    k, v = fused[:, :num_kv_heads], fused[:, num_kv_heads : 2 * num_kv_heads]
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.2] = -1  # padding rows, scattered
    slots[-1] = -1  # and a trailing one, like CUDA-graph padding
    store_kvcache(k, v, k_cache, v_cache, slots.cuda())
    torch.cuda.synchronize()

    kept = slots >= 0
    flat_k = k_cache.view(num_slots, num_kv_heads, head_dim).cpu()
    flat_v = v_cache.view(num_slots, num_kv_heads, head_dim).cpu()
    assert torch.equal(flat_k[slots[kept]], k.cpu()[kept]), f"seed {seed}"
    assert torch.equal(flat_v[slots[kept]], v.cpu()[kept]), f"seed {seed}"
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots[kept]] = False
    assert torch.isnan(flat_k[untouched]).all(), f"a padded/unmapped slot was written (seed {seed})"
    assert torch.isnan(flat_v[untouched]).all(), f"a padded/unmapped slot was written (seed {seed})"


def test_store_rejects_mismatched_shapes():
    from kernels.store_kvcache import store_kvcache

    cache = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(4, 2, 32, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="k must be"):
        store_kvcache(k, k, cache, cache.clone(), torch.zeros(4, dtype=torch.int64, device="cuda"))
    k = torch.randn(4, 2, 64, device="cuda").bfloat16()
    with pytest.raises(ValueError, match="slot_mapping"):
        store_kvcache(k, k, cache, cache.clone(), torch.zeros(3, dtype=torch.int64, device="cuda"))
