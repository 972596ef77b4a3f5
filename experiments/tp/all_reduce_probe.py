"""How long does one tensor-parallel all-reduce take on this machine, by size?

Two ranks (one process per GPU), NCCL with NVLink multicast off (engine.tp.group.SAFE_NCCL_ENV):
for activations of [tokens, hidden] bf16, the time of one all-reduce inside a CUDA graph of
REPEATS back-to-back calls (as the engine's decode graphs run them), and the same through
PyTorch symmetric memory's one-shot all-reduce where this torch has it (checked against NCCL's
sum), and through the engine's own one-shot kernel (engine.tp.symmetric, column one_shot_us:
in place, no copy before it). The fit `time = latency + bytes / bandwidth` over the decode sizes
is what the simulator's hardware entry (interconnect_latency_s, and the effective link bandwidth) should carry.

    python -m experiments.tp.all_reduce_probe --out $OUT/all_reduce   # on a 2-GPU machine
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.tp.group import SAFE_NCCL_ENV, free_port

HIDDEN = 4096  # Qwen3-8B
TOKENS = (1, 8, 32, 64, 128, 256, 512, 1024, 4096)
REPEATS = 50


def _graph_time_us(fn, repeats: int = REPEATS) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeats)
    return float(np.median(times))


def _symmetric(x: torch.Tensor, group_name: str):
    """A one-shot all-reduce through symmetric memory, or None where this torch cannot."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty(x.numel(), dtype=x.dtype, device=x.device)
        symm_mem.rendezvous(buffer, group_name)
        return lambda: torch.ops.symm_mem.one_shot_all_reduce(buffer.copy_(x.view(-1)), "sum", group_name)
    except Exception as exc:  # noqa: BLE001 - report and go on with NCCL alone
        print(f"symmetric memory unavailable: {type(exc).__name__}: {exc}", flush=True)
        return None


def _rank(rank: int, size: int, port: int, out: str) -> None:
    os.environ.update(SAFE_NCCL_ENV)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    group_name = dist.group.WORLD.group_name
    from engine.tp.symmetric import SymmetricAllReduce

    allocated = SymmetricAllReduce.allocate(rank, size, torch.device("cuda", rank), f"probe-{port}")
    engine_one_shot = SymmetricAllReduce.connect(rank, size, f"probe-{port}", allocated)
    rows = []
    for tokens in TOKENS:
        x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16, device="cuda")
        nccl_us = _graph_time_us(lambda: dist.all_reduce(x))
        symmetric = _symmetric(torch.randn_like(x), group_name)
        symm_us, matches = float("nan"), None
        if symmetric is not None:
            probe = torch.randn_like(x)
            reference = probe.clone()
            dist.all_reduce(reference)
            got = _symmetric(probe, group_name)()
            matches = bool(torch.allclose(got.view_as(reference).float(), reference.float(), rtol=1e-2, atol=1e-2))
            symm_us = _graph_time_us(symmetric)
        one_shot_us = _graph_time_us(lambda: engine_one_shot(x)) if engine_one_shot.applies(x) else float("nan")
        rows.append({"tokens": tokens, "bytes": x.numel() * 2, "nccl_us": nccl_us, "symm_one_shot_us": symm_us,
                     "symm_matches_nccl": matches, "one_shot_us": one_shot_us})
    if rank == 0:
        frame = pd.DataFrame(rows)
        decode = frame[frame.tokens <= 512]
        fits = []
        for column in ("nccl_us", "one_shot_us"):
            slope, intercept = np.polyfit(decode.bytes, decode[column], 1)
            fits.append(f"{column[:-3]} (decode sizes): {intercept:.1f} us + bytes / {1e-3 / slope:.0f} GB/s")
        frame.attrs["fit"] = "\n".join(fits)
        Path(out).mkdir(parents=True, exist_ok=True)
        frame.to_csv(Path(out) / "all_reduce.csv", index=False)
        text = frame.to_string(index=False) + "\n" + frame.attrs["fit"] + "\n"
        (Path(out) / "all_reduce.txt").write_text(text)
        print(text, flush=True)
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < 2:
        raise SystemExit("all_reduce_probe needs 2 GPUs")
    mp.spawn(_rank, args=(2, free_port(), str(args.out)), nprocs=2)


if __name__ == "__main__":
    main()
