"""On CUDA: after the warm-up plan's token counts (kernels.moe_configs.warmup_token_counts) have run
the fused MoE once each, calls of any other token count up to the budget compile nothing more
(no new entry in any of its Triton kernels' caches) - among them counts whose integer arguments
fall in every divisibility-by-16 combination, the 6,030 and 6,155 of the H100 call that stalled
(experiments/fidelity/h100_30b_r5) - and each such first call takes no longer than a compile-free
repeat of it would allow."""

from __future__ import annotations

import time

import pytest
import torch

from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda

TOP_K, EXPERTS, HIDDEN, INTER, BUDGET = 8, 128, 2048, 768, 16384  # Qwen3-30B-A3B's layer: the tuned tables


def _kernels():
    from kernels import fused_moe, moe_align_triton, moe_route

    return [moe_route._route_kernel, moe_align_triton._count_kernel, moe_align_triton._scan_kernel,
            moe_align_triton._scatter_kernel, fused_moe._grouped_gemm_kernel]


def _compiled() -> int:
    # Triton's in-memory cache per device: (kernel cache keyed by specialisation, ...)
    return sum(len(entry[0]) for k in _kernels() for entry in k.device_caches.values())


def _layer(record: bool):
    gen = torch.Generator(device="cuda").manual_seed(fresh_seed())
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    row = torch.zeros(EXPERTS, dtype=torch.int32, device="cuda")

    def call(tokens: int) -> None:
        from kernels.fused_moe import fused_moe_routed

        x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
        logits = torch.randn(tokens, EXPERTS, device="cuda", dtype=torch.bfloat16, generator=gen)
        rec = (row, torch.zeros(tokens, dtype=torch.int64, device="cuda")) if record else None
        fused_moe_routed(x, logits, w13, w2, TOP_K, True, record=rec, summed=False)

    return call


def _timed(call, tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call(tokens)
    torch.cuda.synchronize()
    return time.perf_counter() - start


@pytest.mark.parametrize("record", [False, True])
def test_no_compile_after_the_warmup_plan(record):
    from kernels.fused_moe import device_name
    from kernels.moe_configs import warmup_token_counts

    call = _layer(record)
    for tokens in warmup_token_counts(BUDGET, TOP_K, EXPERTS, INTER, "bfloat16", device_name(torch.device("cuda"))):
        call(tokens)
    before = _compiled()
    gen = torch.Generator().manual_seed(fresh_seed())
    others = [6030, 6155, 7299, 12034, 14819, 3, 17, 272, 4097, 6144, 6145, 8191, 12288, 12289, BUDGET]
    others += torch.randint(1, BUDGET + 1, (20,), generator=gen).tolist()
    for tokens in others:
        first = _timed(call, tokens)
        assert _compiled() == before, f"a call of {tokens} tokens compiled a new variant"
        again = min(_timed(call, tokens) for _ in range(2))
        # a compile is 0.3 s or more; a compile-free first call is its repeat's time plus launch noise
        assert first < again + 0.1, f"{tokens} tokens: first call {first:.3f} s against {again:.3f} s after"
