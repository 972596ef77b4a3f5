"""One-pass Gumbel-max sampling kernel on CUDA against the torch formula with the same keys:
Qwen3's vocabulary and ragged ones, with and without per-row cutoffs, greedy rows tie-broken like
torch.argmax."""

from __future__ import annotations

import pytest

from tests.kernels import fused_cases as cases
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


@pytest.mark.parametrize("rows", [2, 7, 140])
@pytest.mark.parametrize("vocab", [1000, 50257, 151936])
@pytest.mark.parametrize("with_cutoff", [False, True])
def test_gumbel_argmax(rows, vocab, with_cutoff):
    cases.check_gumbel_argmax("cuda", rows, vocab, with_cutoff, fresh_seed())


@pytest.mark.parametrize("rows", [3, 256])
def test_gumbel_argmax_reads_bfloat16_logits(rows):
    import torch

    cases.check_gumbel_argmax("cuda", rows, 151936, False, fresh_seed(), dtype=torch.bfloat16)


@pytest.mark.parametrize("world", [2, 3])
def test_vocabulary_slices_draw_the_token_of_the_whole_vocabulary(world):
    # engine.sharded_sampling on the GPU: Qwen3's vocabulary in 2 or 3 slices (the last one
    # shorter), bf16 logits exact in any summation order (quantised weights, 8 products), ties
    # broken across slices as on one GPU
    import torch

    from engine.core.sampling_params import SamplingParams
    from engine.sampler import Sampler
    from tests.engine.test_sharded_sampling import sample_sharded

    gen = torch.Generator().manual_seed(fresh_seed())
    vocab, rows = 151936, 140
    weight = (torch.randint(-2, 3, (vocab, 8), generator=gen).float() / 4).to("cuda", torch.bfloat16)
    hidden = torch.randn(rows, 8, generator=gen).round().clamp(-4, 4).to("cuda", torch.bfloat16)
    params = [SamplingParams(temperature=[0.0, 0.6, 1.0][i % 3], seed=i if i % 2 else None) for i in range(rows)]
    indices = list(range(rows))
    want = Sampler(5, "cuda", "triton").sample(hidden @ weight.T, params, indices)
    draw = Sampler(5, "cuda", "triton").shard_draw(params, indices, vocab)
    for got in sample_sharded(hidden, weight, draw, world, kernel=True):
        assert torch.equal(got, want)
