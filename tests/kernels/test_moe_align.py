"""kernels.moe_align_triton against the torch alignment (kernels.moe_align) on CUDA: equal outputs,
bit for bit, for fresh random routings from decode to prefill sizes (past SMALL_PROGRAMS chunks the
count table is scanned by its own kernel), skewed routing, and inside a CUDA graph replayed with
new routing."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


def _ids(tokens, experts, top_k, seed, skew=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=gen, device="cuda")
    if skew:
        scores[:, :3] += 1.0  # most pairs on three experts: runs of many tiles
    return scores.topk(top_k, dim=1).indices


def _assert_equal(got, want, seed):
    for name, g, w in zip(("sorted_ids", "tile_expert", "num_padded"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{name}: {g.dtype}{tuple(g.shape)} (seed {seed})"
        assert torch.equal(g, w), f"{name} differs (seed {seed})"


@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (3, 128, 8), (140, 128, 8), (256, 128, 8),
                                                    (999, 60, 4), (4096, 128, 8), (16384, 128, 8), (17, 256, 8)])
@pytest.mark.parametrize("skew", [False, True])
def test_triton_alignment_equals_torch(tokens, experts, top_k, block_m, skew):
    from kernels.moe_align import moe_align
    from kernels.moe_align_triton import moe_align_triton

    seed = fresh_seed()
    ids = _ids(tokens, experts, top_k, seed, skew)
    _assert_equal(moe_align_triton(ids, experts, block_m), moe_align(ids, experts, block_m), seed)


def test_triton_alignment_replays_in_a_cuda_graph():
    from kernels.moe_align import moe_align
    from kernels.moe_align_triton import moe_align_triton

    seed = fresh_seed()
    static = _ids(200, 128, 8, seed)
    moe_align_triton(static, 128, 16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_align_triton(static, 128, 16)
    for step in range(3):
        static.copy_(_ids(200, 128, 8, seed + step + 1, skew=step == 1))
        graph.replay()
        _assert_equal(out, moe_align(static, 128, 16), seed)
