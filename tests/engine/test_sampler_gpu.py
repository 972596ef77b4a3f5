"""The sampler on CUDA, both paths (torch ops; the Triton kernel of fused_kernels="triton"),
held to the same properties as the CPU sampler (tests/engine/sampler_checks.py), plus: seeded rows
draw the same tokens on both paths and on the CPU, and a step issues no host synchronisation."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.core.sampling_params import SamplingParams
from engine.sampler import Sampler
from tests.engine import sampler_checks as checks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
]

MODES = ["off", "triton"]
CHECKS = checks.PATH_CHECKS


def _factory(mode: str):
    def make(seed: int) -> Sampler:
        sampler = Sampler(seed, "cuda", mode)
        assert sampler.uses_kernel == (mode == "triton")
        return sampler

    return make


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_sampler_properties_on_cuda(mode, check):
    check(_factory(mode), "cuda")


def test_seeded_rows_agree_across_paths_and_devices():
    checks.check_seeded_rows_match(_factory("triton"), _factory("off"), "cuda")

    def on_cpu(seed: int):  # logits moved to the CPU, tokens back: the CPU torch path
        class Moved:
            def sample(self, logits, params, indices):
                return Sampler(seed).sample(logits.cpu(), params, indices).cuda()

        return Moved()

    checks.check_seeded_rows_match(_factory("triton"), on_cpu, "cuda")


@pytest.mark.parametrize("mode", MODES)
def test_a_sampling_step_does_not_synchronise(mode):
    n, vocab = 140, 151_936
    logits = torch.randn(n, vocab, device="cuda")
    params = [SamplingParams(temperature=0.6, seed=i if i % 2 else None, top_k=(-1, 50)[i % 3 == 0],
                             top_p=(1.0, 0.9)[i % 4 == 0]) for i in range(n)]
    params[::7] = [SamplingParams(temperature=0.0)] * len(params[::7])
    sampler = Sampler(0, "cuda", mode)
    sampler.sample(logits, params, [0] * n)  # builds the composition's tensors (also sync-free)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 4):
            tokens = sampler.sample(logits, params, [step] * n)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (n,) and int(tokens.max()) < vocab
