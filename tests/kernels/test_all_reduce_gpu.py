"""The one-shot all-reduce (kernels.all_reduce through engine.tp.symmetric) on two GPUs.

Each rank draws fresh random inputs; the float32 sum of every rank's input (gathered by NCCL) is
the reference. Checked: eager calls of many sizes back to back (the slots alternate and the
handshake must never let a rank overwrite a slot its peer still reads), bf16 and float32, both
ranks bitwise equal, calls captured in a CUDA graph and replayed on new data, sizes past
MAX_BYTES left to NCCL, and the launch fused with the residual add and RMSNorm against the same
three steps in float32 (hidden sizes of Qwen3-0.6B, -8B and one that is no power of two). A
failing rank raises, and torch.multiprocessing re-raises it here.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]

HIDDEN = 4096
# bf16 inputs summed in float32 and rounded once: half a bf16 ulp of the result, plus slack
BF16_RTOL = 2.0**-8


def _gather(x: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return parts


def _check(got: torch.Tensor, inputs: list[torch.Tensor], what: str) -> None:
    reference = torch.stack([p.float() for p in inputs]).sum(0)
    tol = BF16_RTOL if got.dtype == torch.bfloat16 else 1e-6
    gap = ((got.float() - reference).abs() / reference.abs().clamp_min(1.0)).max().item()
    if gap > tol:
        raise AssertionError(f"{what}: relative gap {gap:.3g} > {tol:.3g}")
    other = _gather(got)
    if not all(torch.equal(other[0], o) for o in other):
        raise AssertionError(f"{what}: ranks hold different sums")


def _eager(group, generator) -> None:
    for call, rows in enumerate((1, 3, 140, 256, 17, 512, 1, 64, 300, 2)):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(rows, HIDDEN, generator=generator, device="cuda").to(dtype)
            if not group.symmetric.applies(x) and dtype == torch.bfloat16:
                raise AssertionError(f"[{rows}, {HIDDEN}] bf16 should take the one-shot kernel")
            inputs = _gather(x)
            _check(group.all_reduce(x.clone()), inputs, f"eager call {call}, {rows} rows {dtype}")


def _graphed(group, generator) -> None:
    sizes = (1, 140, 33, 256)
    static = [torch.zeros(rows, HIDDEN, dtype=torch.bfloat16, device="cuda") for rows in sizes]
    outs = [s.clone() for s in static]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the capture, as the engine does
        for s, o in zip(static, outs):
            o.copy_(group.all_reduce(s.clone()))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s, o in zip(static, outs):
            o.copy_(group.all_reduce(s.clone()))
    for replay in range(5):
        for s in static:
            s.copy_(torch.randn(s.shape, generator=generator, device="cuda"))
        inputs = [_gather(s) for s in static]
        graph.replay()
        for o, parts, rows in zip(outs, inputs, sizes):
            _check(o, parts, f"graph replay {replay}, {rows} rows")


def _large_goes_to_nccl(group, generator) -> None:
    from engine.core.collectives import ONE_SHOT_MAX_BYTES as MAX_BYTES

    rows = MAX_BYTES // (HIDDEN * 2) + 1
    x = torch.randn(rows, HIDDEN, generator=generator, device="cuda").to(torch.bfloat16)
    if group.symmetric.applies(x):
        raise AssertionError(f"{rows} rows ({x.numel() * 2} bytes) should stay on NCCL")
    _check(group.all_reduce(x.clone()), _gather(x), "past MAX_BYTES")


def _fused_norm(group, generator) -> None:
    eps = 1e-6
    # the residual stream and the norm's weight are the same on every rank, as in the model
    shared = torch.Generator(device="cuda").manual_seed(99)
    for rows, dim in ((1, 1024), (140, 4096), (7, 5120), (256, 4096)):
        x = torch.randn(rows, dim, generator=generator, device="cuda").to(torch.bfloat16)
        residual = torch.randn(rows, dim, generator=shared, device="cuda").to(torch.bfloat16)
        weight = (1 + 0.1 * torch.randn(dim, generator=shared, device="cuda")).to(torch.bfloat16)
        if not group.symmetric.applies_to_norm(x, residual):
            raise AssertionError(f"[{rows}, {dim}] should take the fused launch")
        kept = x.clone()
        normed, summed = group.symmetric.add_rms_norm(x, residual, weight, eps)
        if not torch.equal(x, kept):
            raise AssertionError("the fused launch must leave its input as it was")
        reduced = torch.stack([p.float() for p in _gather(x)]).sum(0).to(torch.bfloat16)
        want_summed = (reduced.float() + residual.float()).to(torch.bfloat16)
        if not torch.equal(summed, want_summed):
            raise AssertionError(f"[{rows}, {dim}]: the residual stream differs from sum + residual")
        s = want_summed.float()
        want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        gap = ((normed.float() - want).abs() / want.abs().clamp_min(1e-2)).max().item()
        if gap > BF16_RTOL * 2:  # the norm's output is rounded to bf16 once more
            raise AssertionError(f"[{rows}, {dim}]: normed output off by {gap:.3g}")
        for other in (_gather(normed), _gather(summed)):
            if not torch.equal(other[0], other[1]):
                raise AssertionError(f"[{rows}, {dim}]: ranks hold different results")


def _rank(rank: int, port: int) -> None:
    from engine.tp.group import DistGroup

    group = DistGroup(rank, 2, port, torch.device("cuda", rank), 120.0, "symmetric")
    try:
        generator = torch.Generator(device="cuda").manual_seed(1234 + rank)
        _eager(group, generator)
        _graphed(group, generator)
        _large_goes_to_nccl(group, generator)
        _fused_norm(group, generator)
    finally:
        torch.cuda.synchronize()
        group.destroy()


def test_one_shot_all_reduce_matches_float32_sum_eager_and_in_graphs():
    from engine.tp.group import free_port

    mp.spawn(_rank, args=(free_port(),), nprocs=2)
