"""Does a Triton GEMM that launches enough programs read the decode projections' weights closer
to the memory bound than cuBLAS?

For each projection of a Qwen3-0.6B and -8B layer (qkv, o, gate/up, down) at decode batch sizes,
times cuBLAS (F.linear) and experiments.kernels.skinny_gemm_kernel with each candidate config for
the batch's BLOCK_M (CANDIDATE_CONFIGS, plus the default rule's pick), each as one CUDA-graph
replay over every layer with its own weight (so weights come from memory, as in a step), divided
by the layer count, beside the copy ceiling measured in the same run. Each config's output is
checked against F.linear before it is timed (and again after the replays); a failure is recorded
instead of a time.

    python -m experiments.kernels.skinny_gemm --out $OUT/skinny_gemm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.kernels.decode_gemms import MODELS, projections
from experiments.kernels.timing import per_layer_us
from experiments.kernels.skinny_gemm_kernel import (
    GemmConfig,
    SkinnyGemmWorkspace,
    default_config,
    rows_block,
    skinny_linear,
    warps_for,
)

BATCHES = (1, 8, 32, 64, 140, 256)
# (BLOCK_N, BLOCK_K, SPLIT_K, num_stages), tried with each BLOCK_M; num_warps follows the tile
TILES = (
    (32, 128, 1, 4), (32, 256, 1, 3), (32, 128, 2, 4), (32, 128, 4, 4), (32, 256, 4, 3), (32, 64, 8, 5),
    (64, 128, 1, 4), (64, 256, 1, 3), (64, 128, 2, 4), (64, 64, 4, 5),
    (128, 128, 1, 4), (128, 64, 1, 5), (128, 128, 2, 3),
)  # fmt: skip
CANDIDATE_CONFIGS = tuple(GemmConfig(bm, bn, bk, split, warps_for(bm, bn), stages)
                          for bm in (16, 32, 64) for bn, bk, split, stages in TILES)
BF16_BYTES = 2


def candidates(batch: int, n: int, k: int, num_sms: int, shared_memory: int) -> list[GemmConfig]:
    """The configs tried for one shape: those with the batch's BLOCK_M, and the default rule's
    pick if it is not among them, less those whose pipeline would not fit in shared memory."""
    configs = [c for c in CANDIDATE_CONFIGS if c.block_m == rows_block(batch)]
    default = default_config(batch, n, k, num_sms, BF16_BYTES)
    configs += [] if default in configs else [default]
    return [c for c in configs if c.shared_memory_bytes(BF16_BYTES) <= shared_memory]


def _time_config(config: GemmConfig, weights, x, workspace: SkinnyGemmWorkspace) -> dict:
    """us per layer, or the reason there is none."""
    ref = F.linear(x, weights[0])
    workspace.reserve(x.shape[0], weights[0].shape[0], config)
    try:
        first = skinny_linear(x, weights[0], config, workspace)
        torch.testing.assert_close(first, ref, rtol=1.6e-2, atol=1e-2)
        us = per_layer_us(lambda a, w: skinny_linear(a, w, config, workspace), weights, x)
        # hundreds of replays later (split-K counters reused each time) the same bits come out
        if not torch.equal(skinny_linear(x, weights[0], config, workspace), first):
            return {"us": float("nan"), "error": "output changed after the graph replays"}
    except Exception as exc:  # noqa: BLE001 - a config that fails (compile, resources, wrong) is reported
        return {"us": float("nan"), "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"}
    return {"us": us, "error": "" if us == us else "graph capture failed"}


def measure(model: str, name: str, batches, num_sms: int, shared_memory: int, progress) -> list[dict]:
    n, k = projections(model)[name]
    layers = MODELS[model][-1]
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(layers)]
    workspace = SkinnyGemmWorkspace("cuda")
    rows = []
    for batch in batches:
        progress.set_postfix_str(f"{model} {name} batch {batch}")
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        base = {"model": model, "projection": name, "batch": batch, "n": n, "k": k}
        rows.append({**base, "config": "cublas", "default": False, "us": per_layer_us(F.linear, weights, x),
                     "error": ""})
        default = default_config(batch, n, k, num_sms, BF16_BYTES)
        for config in candidates(batch, n, k, num_sms, shared_memory):
            rows.append({**base, "config": config.label(), "default": config == default,
                         **_time_config(config, weights, x, workspace)})
        progress.update()
    return rows


def summarize(frame, ceiling_tb_s: float, device: str) -> str:
    keys = ["model", "projection", "batch"]
    ok = frame[frame.error == ""]
    cublas = ok[ok.config == "cublas"].set_index(keys).us.rename("cublas_us")
    triton = ok[ok.config != "cublas"]
    best = triton.loc[triton.groupby(keys).us.idxmin()].set_index(keys)
    default = triton[triton.default].set_index(keys).us.rename("default_us")
    table = best[["config", "us", "of_copy"]].rename(columns={"config": "best_config", "us": "best_us"})
    table = table.join(cublas).join(default)
    table["best_vs_cublas"] = table.best_us / table.cublas_us
    layer = table.groupby(["model", "batch"])[["cublas_us", "best_us", "default_us"]].sum()
    layer["best_vs_cublas"] = layer.best_us / layer.cublas_us
    failed = frame[frame.error != ""]
    return (f"copy ceiling {ceiling_tb_s:.2f} TB/s, {device}; us per layer, CUDA-graph replay\n"
            f"per projection (best Triton config; default = default_config's pick):\n"
            + table.reset_index().to_string(index=False, float_format=lambda v: f"{v:.3f}")
            + "\n\nper layer (sum of the four projections):\n"
            + layer.reset_index().to_string(index=False, float_format=lambda v: f"{v:.2f}")
            + f"\n\n{len(failed)} failed configs" + ("".join(
                f"\n  {r.model} {r.projection} batch {r.batch} {r.config}: {r.error}" for r in failed.itertuples()))
            + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for skinny_gemm.csv and .txt")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ", ".join(MODELS))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated row counts")
    args = parser.parse_args(argv)

    import pandas as pd
    from tqdm import tqdm

    from experiments.kernels.timing import copy_ceiling

    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; known: {', '.join(MODELS)}")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    args.out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    ceiling = copy_ceiling() / 1e12
    rows = []
    with tqdm(total=len(models) * 4 * len(batches), desc="skinny_gemm") as progress:
        for model in models:
            for name in projections(model):
                rows += measure(model, name, batches, props.multi_processor_count,
                                props.shared_memory_per_block_optin, progress)
    frame = pd.DataFrame(rows)
    frame["weight_tb_s"] = frame.n * frame.k * BF16_BYTES / (frame.us * 1e-6) / 1e12
    frame["of_copy"] = frame.weight_tb_s / ceiling
    frame.to_csv(args.out / "skinny_gemm.csv", index=False)
    text = summarize(frame, ceiling, props.name)
    (args.out / "skinny_gemm.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
