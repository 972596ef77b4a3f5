"""Kernel timing for the kernel benchmarks: medians with L2 cleared, eager and as one CUDA-graph
replay, and the device's copy and matmul ceilings measured in the same run."""

from __future__ import annotations

import torch
import triton


def bench(fn) -> float:
    """Median milliseconds; do_bench clears L2 before every timed call."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def bench_graph(fn) -> float:
    """Median milliseconds of one CUDA-graph replay of fn (L2 cleared before each): the GPU time
    without Python launch overhead, which eager timing of small shapes mostly measures."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # noqa: BLE001 - an op that cannot be captured gets no graph time
        print(f"capture failed: {exc}", flush=True)
        return float("nan")
    return bench(graph.replay)


def per_layer_us(linear, weights, x) -> float:
    """Microseconds per layer of linear(x, w) over every layer's own weight, as one CUDA-graph
    replay (so each weight comes from memory, as in a decode step); warmed up once first."""

    def run():
        for w in weights:
            linear(x, w)

    run()
    return bench_graph(run) * 1e3 / len(weights)


def both(fn) -> tuple[float, float]:
    return bench(fn), bench_graph(fn)


def copy_ceiling() -> float:
    x = torch.randn(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")  # 2 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * x.element_size() / (ms * 1e-3)


def matmul_ceiling() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    return 2 * 8192**3 / (bench(lambda: a @ b) * 1e-3)


def decode_bandwidth_table(argv, description: str, one_batch, batches, name: str):
    """A decode probe's main: --out, one_batch(batch, rng) rows for each batch with of_copy
    (read_tb_s over the copy ceiling, measured now), saved as out/name.csv. Returns the frame,
    the ceiling in TB/s and the output folder."""
    import argparse
    from pathlib import Path

    import numpy as np
    import pandas as pd

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame([row for batch in batches for row in one_batch(batch, rng)])
    tb_s = copy_ceiling() / 1e12
    frame = frame.assign(of_copy=frame.read_tb_s / tb_s)
    frame.to_csv(args.out / f"{name}.csv", index=False)
    return frame, tb_s, args.out
