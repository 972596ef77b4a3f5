"""kernels.fused_moe against the float32 per-token reference (kernels.moe_reference), fresh random
inputs each run, on CUDA: several token counts (decode to prefill), expert counts and top-k, three
dtypes; the alignment step's invariants; a CUDA graph replayed with new routing; the tiny MoE
model with the kernel wired in against its torch path.

Tolerances, relative to the reference's largest magnitude: float32 1e-4 (IEEE products), float16
5e-3, bfloat16 3e-2 (inputs and the intermediate h rounded to 8 mantissa bits).
"""

from __future__ import annotations

import pytest
import torch

from kernels.moe_configs import GemmTiles, MoeTiles
from kernels.moe_reference import fused_moe_ref, grouped_moe, route
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _case(tokens, experts, top_k, hidden, inter, dtype, seed, skew: float = 1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen, device="cuda").to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen, device="cuda") / hidden**0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen, device="cuda") / inter**0.5).to(dtype)
    logits = skew * torch.randn(tokens, experts, generator=gen, device="cuda")
    weights, ids = route(logits.to(dtype), top_k, renormalize=True)
    return x, w13, w2, weights, ids


def _assert_close(got, want, dtype, seed):
    scale = float(want.abs().max()) or 1.0
    err = float((got.float() - want).abs().max()) / scale
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} (seed {seed})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (5, 8, 2), (64, 16, 4), (1, 128, 8), (37, 128, 8),
                                                    (256, 128, 8), (700, 64, 6)])
@pytest.mark.parametrize("hidden, inter", [(256, 96), (2048, 768)])
def test_fused_moe_matches_float32_reference(dtype, tokens, experts, top_k, hidden, inter):
    from kernels.fused_moe import fused_moe

    if hidden == 2048 and tokens > 64:
        pytest.skip("the per-token reference is slow at Qwen3-30B-A3B's width; (37, 128, 8) covers it")
    seed = fresh_seed()
    case = _case(tokens, experts, top_k, hidden, inter, dtype, seed)
    got = fused_moe(*case)
    assert got.dtype == dtype and got.shape == (tokens, hidden)
    _assert_close(got, fused_moe_ref(*case), dtype, seed)


# Configs the tuner's grid can put in a table (experiments/moe/tune_fused_moe.py): every BLOCK_M,
# the extremes of BLOCK_N and BLOCK_K, both warp counts and several stage counts.
TUNED_TILES = [
    MoeTiles(16, GemmTiles(32, 256, 4, 2), GemmTiles(128, 64, 8, 5)),
    MoeTiles(16, GemmTiles(128, 128, 8, 3), GemmTiles(32, 128, 4, 4)),
    MoeTiles(32, GemmTiles(64, 256, 8, 2), GemmTiles(64, 256, 4, 3)),
    MoeTiles(64, GemmTiles(128, 64, 8, 4), GemmTiles(128, 128, 8, 3)),
    MoeTiles(64, GemmTiles(32, 64, 4, 5), GemmTiles(64, 128, 4, None)),
    MoeTiles(128, GemmTiles(64, 64, 4, 3), GemmTiles(128, 64, 8, 4)),  # prefill sizes (T >= 4096)
]


@pytest.mark.parametrize("tiles", TUNED_TILES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 37, 300])
def test_tuned_tiles_match_float32_reference(tiles, dtype, tokens):
    from kernels.fused_moe import fused_moe

    seed = fresh_seed()
    case = _case(tokens, 128, 8, 512, 384, dtype, seed)  # Qwen3-30B-A3B's E and k, narrower layers
    want = fused_moe_ref(*case)
    _assert_close(fused_moe(*case, tiles=tiles), want, dtype, seed)
    torch.testing.assert_close(fused_moe(*case, tiles=tiles, align="torch"), fused_moe(*case, tiles=tiles),
                               rtol=0, atol=0)  # the two alignments give one layout


def test_skewed_routing_onto_one_expert():
    """Every token on the same experts: one expert's run spans many tiles."""
    from kernels.fused_moe import fused_moe

    seed = fresh_seed()
    x, w13, w2, weights, ids = _case(300, 16, 2, 128, 64, torch.bfloat16, seed)
    ids = torch.stack([torch.full_like(ids[:, 0], 3), torch.full_like(ids[:, 0], 11)], dim=1)
    _assert_close(fused_moe(x, w13, w2, weights, ids), fused_moe_ref(x, w13, w2, weights, ids), torch.bfloat16, seed)


@pytest.mark.parametrize("tokens, experts, top_k, block_m", [(1, 8, 2, 16), (50, 128, 8, 16), (999, 64, 4, 64)])
def test_moe_align_groups_every_pair_once_in_one_expert_tiles(tokens, experts, top_k, block_m):
    from kernels.fused_moe import moe_align

    ids = torch.randint(0, experts, (tokens, experts), device="cuda").argsort(dim=1)[:, :top_k]  # distinct per row
    sorted_ids, tile_expert, num_padded = moe_align(ids, experts, block_m)
    n = tokens * top_k
    flat = ids.reshape(-1)
    valid = sorted_ids[: int(num_padded)]
    real = valid[valid < n].long()
    assert sorted(real.tolist()) == list(range(n))  # every pair exactly once
    assert int(num_padded) % block_m == 0 and bool((sorted_ids[int(num_padded):] == n).all())
    for tile in range(int(num_padded) // block_m):
        members = sorted_ids[tile * block_m:(tile + 1) * block_m].long()
        members = members[members < n]
        assert bool((flat[members] == tile_expert[tile]).all())


def test_fused_moe_replays_in_a_cuda_graph_with_new_routing():
    from kernels.fused_moe import fused_moe

    seed = fresh_seed()
    x, w13, w2, weights, ids = _case(24, 32, 4, 256, 128, torch.bfloat16, seed)
    static = [t.clone() for t in (x, weights, ids)]
    fused_moe(static[0], w13, w2, static[1], static[2])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(static[0], w13, w2, static[1], static[2])
    for step in range(3):
        x2, _, _, weights2, ids2 = _case(24, 32, 4, 256, 128, torch.bfloat16, seed + step + 1, skew=3.0)
        for buf, new in zip(static, (x2, weights2, ids2)):
            buf.copy_(new)
        graph.replay()
        _assert_close(out, fused_moe_ref(x2, w13, w2, weights2, ids2), torch.bfloat16, seed)


def test_grouped_torch_path_agrees_on_cuda():
    seed = fresh_seed()
    case = _case(40, 16, 4, 128, 64, torch.float32, seed)
    _assert_close(grouped_moe(*case), fused_moe_ref(*case), torch.float32, seed)


def test_tiny_moe_model_with_the_kernel_matches_its_torch_path(tmp_path):
    from engine.checkpoint import write_checkpoint
    from engine.loader import load_model
    from tests.engine.fused_model_checks import prefill_then_decode

    ckpt = write_checkpoint("tiny-qwen3-moe", tmp_path / "ckpt")
    model, _ = load_model(ckpt, dtype="float32", device="cuda", attention_backend="torch")
    want = prefill_then_decode(model, "cuda", lens=(5, 40, 3))
    assert model.set_fused_kernels("triton") > 0
    got = prefill_then_decode(model, "cuda", lens=(5, 40, 3))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))
