"""Per-op device time of one MoE layer of Qwen3-30B-A3B, before and after the routing fusion.

    PYTHONPATH=. python experiments/moe/profile_layer.py --out experiments/moe/h200_run3/layer.csv   # on a GPU

From the router's input (the post-attention norm's output x) to the next layer's input norm,
which both paths end in, per token count T (decode sizes and prefill steps):

- before: gate GEMM; kernels.moe_reference.route (softmax, top-k, renormalise, cast: several torch
  kernels); kernels.fused_moe.fused_moe (Triton alignment, two GEMMs, the sum over k);
  add_rms_norm of [T, hidden];
- after: gate GEMM; kernels.fused_moe.fused_moe_routed (router kernel with the alignment's counts,
  scatter, two GEMMs) unsummed; add_rms_norm summing [T, k, hidden] as it reads it;
- and each op alone: gate, route, route_align, align (ids given), gemms, sum, norm, norm_terms.

Each time is a CUDA graph of R launches, each on its own random input (a different routing, so
experts are not read from L2 the way consecutive layers would not), replayed; per launch =
elapsed / (replays * R). Weights random (normal / sqrt(fan-in)), bf16, tiles from the GPU's table.
Writes a CSV (device, tokens, op, us) and prints a table of before/after per T.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from experiments.moe.tune_fused_moe import time_graph
from kernels.fused_moe import call_tiles, experts, fused_moe, fused_moe_routed
from kernels.moe_align_triton import moe_align_triton
from kernels.moe_reference import route
from kernels.moe_route import route_align
from kernels.rmsnorm import add_rms_norm

TOKENS = (1, 16, 64, 140, 256, 4096, 16384)
ROUTINGS = 4


class Layer:
    def __init__(self, experts_: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype):
        self.e, self.k = experts_, top_k
        self.gate = (torch.randn(experts_, hidden, device="cuda") / hidden**0.5).to(dtype)
        self.w13 = (torch.randn(experts_, 2 * inter, hidden, device="cuda") / hidden**0.5).to(dtype)
        self.w2 = (torch.randn(experts_, hidden, inter, device="cuda") / inter**0.5).to(dtype)
        self.norm_w = torch.ones(hidden, device="cuda", dtype=dtype)


def ops(layer: Layer, tokens: int, dtype: torch.dtype) -> dict:
    """op name -> launch(r) over R inputs of `tokens` tokens."""
    hidden = layer.gate.shape[1]
    xs = [torch.randn(tokens, hidden, device="cuda").to(dtype) for _ in range(ROUTINGS)]
    res = [torch.randn(tokens, hidden, device="cuda").to(dtype) for _ in range(ROUTINGS)]
    logits = [x @ layer.gate.t() for x in xs]
    routed = [route(lg, layer.k, True) for lg in logits]
    tiles = call_tiles(xs[0], layer.w2, layer.k, None)
    aligned = [moe_align_triton(ids, layer.e, tiles.block_m) for _, ids in routed]
    terms = [experts(x, layer.w13, layer.w2, w.contiguous(), a, tiles, layer.k) for x, (w, _), a in
             zip(xs, routed, aligned)]
    summed = [t.sum(dim=1) for t in terms]
    k, e = layer.k, layer.e

    def before(r):
        lg = xs[r] @ layer.gate.t()
        w, ids = route(lg, k, True)
        return add_rms_norm(fused_moe(xs[r], layer.w13, layer.w2, w, ids, tiles), res[r], layer.norm_w, 1e-6)

    def after(r):
        lg = xs[r] @ layer.gate.t()
        y = fused_moe_routed(xs[r], lg, layer.w13, layer.w2, k, True, tiles, summed=False)
        return add_rms_norm(y, res[r], layer.norm_w, 1e-6)

    return {
        "before": before, "after": after,
        "gate": lambda r: xs[r] @ layer.gate.t(),
        "route": lambda r: route(logits[r], k, True),
        "route_align": lambda r: route_align(logits[r], k, True, tiles.block_m),
        "align": lambda r: moe_align_triton(routed[r][1], e, tiles.block_m),
        "gemms": lambda r: experts(xs[r], layer.w13, layer.w2, routed[r][0].contiguous(), aligned[r], tiles, k),
        "sum": lambda r: terms[r].sum(dim=1),
        "norm": lambda r: add_rms_norm(summed[r], res[r], layer.norm_w, 1e-6),
        "norm_terms": lambda r: add_rms_norm(terms[r], res[r], layer.norm_w, 1e-6),
    }


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    args = parser.parse_args(argv)
    dtype = torch.bfloat16
    layer = Layer(args.experts, args.top_k, args.hidden, args.inter, dtype)
    device = torch.cuda.get_device_name()
    rows = []
    for tokens in args.tokens:
        replays = 3 if tokens >= 4096 else 20
        for op, launch in ops(layer, tokens, dtype).items():
            rows.append({"device": device, "tokens": tokens, "op": op, "us": time_graph(launch, ROUTINGS, replays)})
        torch.cuda.empty_cache()
        table = pd.DataFrame(rows)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)  # after every T: a cut-off run keeps what it measured
        mine = table[table.tokens == tokens].set_index("op").us
        print(f"T={tokens:6d} before {mine['before']:8.1f} us  after {mine['after']:8.1f} us  "
              f"(gate {mine['gate']:.1f}, route {mine['route']:.1f} + align {mine['align']:.1f} -> route_align "
              f"{mine['route_align']:.1f}, gemms {mine['gemms']:.1f}, sum {mine['sum']:.1f} + norm {mine['norm']:.1f}"
              f" -> norm_terms {mine['norm_terms']:.1f})", flush=True)
    return pd.DataFrame(rows)


if __name__ == "__main__":
    main()
