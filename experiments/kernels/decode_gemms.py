"""How far from the weight-read bound are the decode step's projections, and does another GEMM
back end get closer?

For each projection of a Qwen3-0.6B and -8B layer (qkv, o, gate/up, down) at decode batch sizes,
times F.linear as one CUDA-graph replay over every layer (each with its own weight, so weights
come from memory as in a step), divided by the layer count, through cuBLAS (torch's default) and
through cuBLASLt (torch.backends.cuda.preferred_blas_library), and reports the weight bytes read
per second beside the copy ceiling measured in the same run.

    python -m experiments.kernels.decode_gemms --out $OUT/decode_gemms
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

MODELS = {  # hidden, q heads, kv heads, head_dim, intermediate, layers
    "qwen3-0.6b": (1024, 16, 8, 128, 3072, 28),
    "qwen3-8b": (4096, 32, 8, 128, 12288, 36),
}
BATCHES = (1, 64, 140, 256)
LIBRARIES = ("cublas", "cublaslt")


def projections(model: str) -> dict[str, tuple[int, int]]:
    """name -> (out features, in features) of one layer's weight."""
    hidden, heads, kv_heads, head_dim, inter, _ = MODELS[model]
    return {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
            "gate_up": (2 * inter, hidden), "down": (hidden, inter)}


def measure(model: str) -> list[dict]:
    from experiments.kernels.timing import per_layer_us

    layers = MODELS[model][-1]
    rows = []
    for name, (n_out, n_in) in projections(model).items():
        weights = [torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        for batch in BATCHES:
            x = torch.randn(batch, n_in, device="cuda", dtype=torch.bfloat16)
            for library in LIBRARIES:
                torch.backends.cuda.preferred_blas_library(library)
                us = per_layer_us(F.linear, weights, x)
                rows.append({"model": model, "projection": name, "batch": batch, "library": library,
                             "us": us, "weight_tb_s": n_out * n_in * 2 / (us * 1e-6) / 1e12})
        del weights
    torch.backends.cuda.preferred_blas_library("cublas")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for decode_gemms.csv and .txt")
    args = parser.parse_args(argv)

    import pandas as pd

    from experiments.kernels.timing import copy_ceiling

    args.out.mkdir(parents=True, exist_ok=True)
    ceiling = copy_ceiling() / 1e12
    frame = pd.DataFrame([r for m in MODELS for r in measure(m)])
    frame["of_copy"] = frame.weight_tb_s / ceiling
    frame.to_csv(args.out / "decode_gemms.csv", index=False)
    per_layer = frame.groupby(["model", "batch", "library"]).us.sum().unstack("library")
    text = (f"copy ceiling {ceiling:.2f} TB/s, {torch.cuda.get_device_name()}\n" + frame.to_string(index=False)
            + "\n\nus per layer (all four projections):\n" + per_layer.to_string() + "\n")
    (args.out / "decode_gemms.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
