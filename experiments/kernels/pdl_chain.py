"""Does programmatic dependent launch (PDL) cut the fixed cost of each kernel in a decode step?

A Qwen3-0.6B decode step runs ~10 kernels a layer, and each projection takes 5-8 us in a CUDA
graph whatever its size (experiments/norm_linear/README.md), which looks like per-kernel latency:
launch, ramp and drain, each kernel waiting for the one before to end. With PDL (Hopper) a kernel
can be resident before its predecessor ends and wait on the device (griddepcontrol.wait) instead.

The probe chains four dependent projections a layer, each reading the one before's output, with
the 0.6B's weight sizes (1024 -> 6144 -> 1024 -> 4096 -> 1024), over 28 layers with their own
weights, as one CUDA-graph replay: cuBLAS (F.linear), the Triton GEMM of skinny_gemm_kernel with
its default config, the same with PDL, and with PDL and each program's weights prefetched into L2
before it waits for the kernel ahead (weights never depend on it). The PDL chains' outputs are
checked against the plain Triton chain's (same kernels, same configs: bit for bit) before timing.

    python -m experiments.kernels.pdl_chain --out $OUT/pdl
"""

from __future__ import annotations

import argparse
from pathlib import Path

MODEL = "qwen3-0.6b"
BATCHES = (1, 8, 64, 140)


def chain_widths(model: str = MODEL) -> tuple[int, ...]:
    """A layer's chain, hidden -> gate/up -> hidden -> qkv -> hidden: each projection's in and out
    features, with the model's weight sizes (each reads the one before's output, so it cannot be
    the real qkv -> o order, whose o reads only the attention output)."""
    from experiments.kernels.decode_gemms import MODELS, projections

    hidden, shapes = MODELS[model][0], projections(model)
    return hidden, shapes["gate_up"][0], hidden, shapes["qkv"][0], hidden


def num_layers(model: str = MODEL) -> int:
    from experiments.kernels.decode_gemms import MODELS

    return MODELS[model][-1]


def build(batch: int):
    import torch

    from experiments.kernels.skinny_gemm_kernel import SkinnyGemmWorkspace, default_config, num_sms

    sms = num_sms(torch.cuda.current_device())
    widths = chain_widths()
    shapes = list(zip(widths, widths[1:]))  # (in, out) of each projection
    weights = [[torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for k, n in shapes]
               for _ in range(num_layers())]
    configs = [default_config(batch, n, k, sms) for k, n in shapes]
    workspace = SkinnyGemmWorkspace("cuda")
    for (k, n), config in zip(shapes, configs):
        workspace.reserve(batch, n, config)
    x = torch.randn(batch, widths[0], device="cuda", dtype=torch.bfloat16)
    return weights, configs, workspace, x


def chains(weights, configs, workspace, x):
    """name -> a function running the whole chain from x (returns the last output)."""
    import torch.nn.functional as F

    from experiments.kernels.skinny_gemm_kernel import skinny_linear

    def cublas():
        h = x
        for layer in weights:
            for w in layer:
                h = F.linear(h, w)
        return h

    def triton_chain(pdl: bool, prefetch: bool = False):
        def run():
            h = x
            for layer in weights:
                for w, config in zip(layer, configs):
                    h = skinny_linear(h, w, config, workspace, pdl=pdl, prefetch=prefetch)
            return h
        return run

    return {"cublas": cublas, "triton": triton_chain(False), "triton_pdl": triton_chain(True),
            "triton_pdl_prefetch": triton_chain(True, True)}


def measure(batches=BATCHES) -> list[dict]:
    import torch

    from experiments.kernels.timing import bench_graph

    rows = []
    for batch in batches:
        weights, configs, workspace, x = build(batch)
        runs = chains(weights, configs, workspace, x)
        plain = runs["triton"]()
        others = [runs[name]() for name in ("triton_pdl", "triton_pdl_prefetch")]
        torch.cuda.synchronize()
        identical = all(bool(torch.equal(plain, other)) for other in others)
        for name, run in runs.items():
            us = bench_graph(run) * 1e3 / num_layers()
            rows.append({"batch": batch, "chain": name, "us_per_layer": us, "us_per_kernel": us / 4,
                         "pdl_output_identical": identical, "configs": " ".join(c.label() for c in configs)})
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for pdl_chain.csv and pdl_chain.txt")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    args = parser.parse_args(argv)
    import pandas as pd
    import torch

    if not torch.cuda.is_available():
        print("error: pdl_chain needs a CUDA GPU (Hopper or later for PDL)")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(measure(args.batches))
    table.to_csv(args.out / "pdl_chain.csv", index=False)
    wide = table.pivot(index="batch", columns="chain", values="us_per_layer")
    wide["pdl_vs_triton"] = wide["triton_pdl"] / wide["triton"]
    wide["pdl_vs_cublas"] = wide["triton_pdl"] / wide["cublas"]
    wide["prefetch_vs_cublas"] = wide["triton_pdl_prefetch"] / wide["cublas"]
    text = f"{torch.cuda.get_device_name()}; us per layer of 4 dependent projections, CUDA-graph replay\n"
    text += wide.round(3).to_string() + "\n"
    (args.out / "pdl_chain.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
