"""What does storing K/V from the q/k norm + rotary kernel save over a separate store kernel?

For the Qwen3-0.6B and -8B attention shapes (16/32 query heads, 8 KV heads, head_dim 128, 256-token
pages), times kernels.rotary.qk_norm_rope_ followed by kernels.store_kvcache against one
qk_norm_rope_ call with store=..., as one CUDA-graph replay over every layer (each with its own
qkv buffer and cache), divided by the layer count, at decode batch sizes.

    python -m experiments.kernels.rope_store --out $OUT/rope_store
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

MODELS = {"qwen3-0.6b": (16, 28), "qwen3-8b": (32, 36)}  # query heads, layers
KV_HEADS, HEAD_DIM, PAGE, BLOCKS = 8, 128, 256, 64
BATCHES = (1, 64, 140, 256, 512)


def measure(model: str, batch: int) -> dict:
    from experiments.kernels.timing import bench_graph
    from kernels.rotary import qk_norm_rope_
    from kernels.store_kvcache import store_kvcache

    heads, layers = MODELS[model]
    dev, bf16 = "cuda", torch.bfloat16
    width = (heads + 2 * KV_HEADS) * HEAD_DIM
    bufs = [torch.randn(batch, width, device=dev, dtype=bf16) for _ in range(layers)]
    caches = [(torch.zeros(BLOCKS, PAGE, KV_HEADS, HEAD_DIM, device=dev, dtype=bf16),
               torch.zeros(BLOCKS, PAGE, KV_HEADS, HEAD_DIM, device=dev, dtype=bf16)) for _ in range(layers)]
    angles = torch.rand(batch, HEAD_DIM // 2, device=dev) * 6.28
    cos, sin = angles.cos(), angles.sin()
    norm = torch.ones(HEAD_DIM, device=dev, dtype=bf16)
    slots = torch.randperm(BLOCKS * PAGE, device=dev)[:batch]

    def views(buf):
        q, k, v = buf.split([heads * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        return q.view(batch, heads, HEAD_DIM), k.view(batch, KV_HEADS, HEAD_DIM), v.view(batch, KV_HEADS, HEAD_DIM)

    def separate():
        for buf, (kc, vc) in zip(bufs, caches):
            q, k, v = views(buf)
            qk_norm_rope_(q, k, cos, sin, norm, norm, 1e-6)
            store_kvcache(k, v, kc, vc, slots)

    def fused():
        for buf, (kc, vc) in zip(bufs, caches):
            q, k, v = views(buf)
            qk_norm_rope_(q, k, cos, sin, norm, norm, 1e-6, store=(v, kc, vc, slots))

    separate(), fused()
    times = {name: bench_graph(run) * 1e3 / layers for name, run in (("separate", separate), ("fused", fused))}
    return {"model": model, "batch": batch, "separate_us": times["separate"], "fused_us": times["fused"],
            "saved_us_per_layer": times["separate"] - times["fused"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rope_store.csv")
    args = parser.parse_args(argv)

    import pandas as pd

    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([measure(m, b) for m in MODELS for b in BATCHES])
    frame.to_csv(args.out / "rope_store.csv", index=False)
    print(f"per layer, CUDA-graph replay, {torch.cuda.get_device_name()}\n" + frame.to_string(index=False))


if __name__ == "__main__":
    main()
