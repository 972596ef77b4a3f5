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
