"""Does folding the RMSNorm (and SwiGLU's gate) into the projection pay at decode batch sizes, and
with which tiles?

For the Qwen3-0.6B and -8B layer shapes, times the attention input and the MLP input of a decode
step as the engine runs them (add_rms_norm + cuBLAS GEMM, then add_rms_norm + GEMM +
silu_and_mul) against experiments.kernels.norm_linear_kernel (one kernel each), with its
default tiles and with each of CANDIDATE_CONFIGS. Each timing is one CUDA-graph replay of every
layer of the model, each with its own weights (so they come from memory, not L2, as in a step),
divided by the layer count.

    python -m experiments.kernels.norm_linear --out $OUT/norm_linear
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
CANDIDATE_CONFIGS = [
    dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 64, 256, 4, 3), (32, 32, 128, 4, 4),
        (32, 64, 128, 4, 4), (64, 32, 128, 4, 4), (64, 64, 128, 4, 3), (64, 128, 64, 4, 4), (128, 64, 64, 8, 3),
    ]
]
MODELS = {  # hidden, qkv rows, intermediate, layers
    "qwen3-0.6b": (1024, 4096, 3072, 28),
    "qwen3-8b": (4096, 6144, 12288, 36),
}
ROWS = (1, 16, 64, 140, 256, 512)


def _layer_weights(hidden: int, qkv_rows: int, inter: int, layers: int) -> list[dict[str, torch.Tensor]]:
    def make(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * shape[-1] ** -0.5

    return [{"g1": 1 + 0.1 * make(hidden), "qkv": make(qkv_rows, hidden), "g2": 1 + 0.1 * make(hidden),
             "gate_up": make(2 * inter, hidden)} for _ in range(layers)]


def _unfolded(weights, x, residual):
    from kernels.activation import silu_and_mul
    from kernels.rmsnorm import add_rms_norm

    def run():
        for w in weights:
            h, stream = add_rms_norm(x, residual, w["g1"], 1e-6)
            F.linear(h, w["qkv"])
            h, stream = add_rms_norm(x, stream, w["g2"], 1e-6)
            silu_and_mul(F.linear(h, w["gate_up"]))

    return run


def _folded(weights, x, residual, config):
    from experiments.kernels.norm_linear_kernel import norm_linear

    def run():
        for w in weights:
            _, stream = norm_linear(x, residual, w["g1"], w["qkv"], 1e-6, config=config)
            norm_linear(x, stream, w["g2"], w["gate_up"], 1e-6, silu_mul=True, config=config)

    return run


def measure(model: str) -> list[dict]:
    from experiments.kernels.timing import bench_graph

    hidden, qkv_rows, inter, layers = MODELS[model]
    weights = _layer_weights(hidden, qkv_rows, inter, layers)
    weight_bytes = sum(w["qkv"].nbytes + w["gate_up"].nbytes for w in weights)
    rows_out = []
    for rows in ROWS:
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        runs = {"unfolded": _unfolded(weights, x, residual), "folded": _folded(weights, x, residual, None)}
        runs.update({"folded " + "/".join(str(v) for v in c.values()): _folded(weights, x, residual, c)
                     for c in CANDIDATE_CONFIGS})
        for name, run in runs.items():
            try:
                run()
                us = bench_graph(run) * 1e3 / layers
            except Exception as exc:  # noqa: BLE001 - a tile that does not fit (shared memory) is reported
                print(f"{model} rows {rows} {name}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                us = float("nan")
            rows_out.append({"model": model, "rows": rows, "variant": name, "us_per_layer": us,
                             "weight_tb_s": weight_bytes / layers / (us * 1e-6) / 1e12})
    return rows_out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for norm_linear.csv and .txt")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    args = parser.parse_args(argv)

    import pandas as pd

    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame([r for m in args.models.split(",") for r in measure(m)])
    frame.to_csv(args.out / "norm_linear.csv", index=False)
    base = frame[frame.variant == "unfolded"].set_index(["model", "rows"]).us_per_layer
    frame["vs_unfolded"] = frame.us_per_layer / frame.set_index(["model", "rows"]).index.map(base)
    best = frame[frame.variant.str.startswith("folded")].sort_values("us_per_layer").groupby(["model", "rows"]).head(1)
    summary = frame[frame.variant.isin(["unfolded", "folded"])]
    text = (f"per layer (attention input + MLP input), CUDA-graph replay, {torch.cuda.get_device_name()}\n"
            + summary.to_string(index=False) + "\n\nbest folded tiles:\n"
            + best.sort_values(["model", "rows"]).to_string(index=False) + "\n")
    (args.out / "norm_linear.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
