"""Tune kernels.fused_moe's tiles per token count and write the table kernels.moe_configs reads.

    PYTHONPATH=. python experiments/moe/tune_fused_moe.py --budget-s 240 \
        --report experiments/moe/tune_h200/report.json   # on a GPU; --out defaults to kernels/configs/

Qwen3-30B-A3B's MoE layer by default (E=128, k=8, hidden 2048, inter 768, bf16), uniform random
top-k routing. Each measurement is a CUDA graph of R launches, each on its own routing (so a
launch reads other experts than the last one, as consecutive layers do, instead of hitting in L2),
replayed a few times; time per launch = elapsed / (replays * R).

Per T (decode sizes first, so a budget cut leaves the prefill sizes at the defaults' nearest entry;
--missing-only tunes only the token counts the GPU's table lacks and keeps its other entries):
for each candidate BLOCK_M, each GEMM sweeps BLOCK_N x BLOCK_K x warps at 3 stages, then 2/4/5
stages for its 3 best; configs whose shared memory or accumulator registers cannot fit are
skipped, and so are those that fail to compile. Past --budget-s nothing new is measured (each GEMM
keeps the best config it measured, today's default at least) and later token counts are left
out. BLOCK_M is the one minimising gate/up + down + alignment. The floor is the distinct experts'
weight bytes at the copy bandwidth.
Reports per T: best configs, times, floor fractions, the alignment (torch vs Triton) and the whole
call with today's defaults and torch alignment against the tuned one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from experiments.moe.decode_bound import measure_copy_bandwidth
from kernels.fused_moe import fused_moe, grouped_gemm, moe_align, moe_align_triton
from kernels.moe_configs import GemmTiles, MoeTiles, block_m_for, load_table, table_path, write_table

TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 4096, 8192, 16384)
# decode batches first, then the prefill steps the default budget (16,384 tokens) fills
PRIORITY = (128, 192, 256, 96, 64, 32, 16, 8, 4, 2, 1, 16384, 4096, 1024, 512, 8192)
ROUTINGS = 8


def candidates_m(tokens: int, top_k: int, experts: int) -> list[int]:
    """Tile heights worth trying: the two tallest that the experts' pairs fill at least half of
    (16 where none does); shorter ones only pad less where few pairs land on each expert."""
    per_expert = tokens * top_k / experts
    return ([m for m in (16, 32, 64, 128) if m == 16 or per_expert > m / 2])[-2:]


def fits(block_m: int, tiles: GemmTiles, gated: bool, elem: int, smem_limit: int) -> bool:
    """Pipelined operand buffers within shared memory; fp32 accumulators at most 128 registers a thread."""
    per_stage = (block_m * tiles.block_k + (2 if gated else 1) * tiles.block_k * tiles.block_n) * elem
    acc_regs = block_m * tiles.block_n * (2 if gated else 1) / (32 * tiles.num_warps)
    small_tile = block_m * tiles.block_n <= 1024 and tiles.num_warps > 4
    return per_stage * (tiles.num_stages or 3) <= smem_limit and acc_regs <= 128 and not small_tile


def stage_one(block_m: int, gated: bool, elem: int, smem: int) -> list[GemmTiles]:
    grid = [GemmTiles(n, k, w, 3) for n in (32, 64, 128) for k in (64, 128, 256) for w in (4, 8)]
    return [g for g in grid if fits(block_m, g, gated, elem, smem)]


def time_graph(launch, routings: int, replays: int) -> float:
    """Microseconds per launch of launch(r), r = 0..routings-1, captured in one CUDA graph."""
    for r in range(routings):
        launch(r)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(routings):
            launch(r)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * routings)


class Layer:
    """One MoE layer's weights and R routings of T tokens, with the buffers each GEMM writes."""

    def __init__(self, args, tokens: int):
        e, k, hid, inter, dt = args.experts, args.top_k, args.hidden, args.inter, getattr(torch, args.dtype)
        self.args, self.tokens = args, tokens
        self.w13 = (torch.randn(e, 2 * inter, hid, device="cuda") / hid**0.5).to(dt)
        self.w2 = (torch.randn(e, hid, inter, device="cuda") / inter**0.5).to(dt)
        self.x = torch.randn(tokens, hid, device="cuda").to(dt)
        self.h = torch.randn(tokens * k, inter, device="cuda").to(dt)
        self.out_h, self.out_y = torch.empty_like(self.h), torch.empty(tokens * k, hid, device="cuda", dtype=dt)
        self.ids = [torch.rand(tokens, e, device="cuda").topk(k, dim=1).indices for _ in range(ROUTINGS)]
        self.weights = [torch.softmax(torch.randn(tokens, k, device="cuda"), 1).to(dt) for _ in range(ROUTINGS)]
        self.distinct = sum(int(i.unique().numel()) for i in self.ids) / ROUTINGS
        self.replays = 3 if tokens >= 1024 else 10
        self.aligned: dict[int, list] = {}

    def floor_us(self, gated: bool | None) -> float:
        a = self.args
        per_expert = {True: 2, False: 1, None: 3}[gated] * a.hidden * a.inter * getattr(torch, a.dtype).itemsize
        return self.distinct * per_expert / a.bandwidth * 1e6

    def gemm_us(self, block_m: int, tiles: GemmTiles, gated: bool) -> float:
        if block_m not in self.aligned:
            self.aligned[block_m] = [moe_align(i, self.args.experts, block_m) for i in self.ids]
        aligned = self.aligned[block_m]
        a, w, out = (self.x, self.w13, self.out_h) if gated else (self.h, self.w2, self.out_y)
        return time_graph(lambda r: grouped_gemm(a, w, out, self.weights[r], aligned[r], block_m, tiles, gated),
                          ROUTINGS, self.replays)

    def align_us(self, block_m: int, triton: bool) -> float:
        align = moe_align_triton if triton else moe_align
        return time_graph(lambda r: align(self.ids[r], self.args.experts, block_m), ROUTINGS, self.replays)

    def call_us(self, tiles: MoeTiles, align: str) -> float:
        return time_graph(lambda r: fused_moe(self.x, self.w13, self.w2, self.weights[r], self.ids[r], tiles, align),
                          ROUTINGS, self.replays)


def sweep(layer: Layer, block_m: int, gated: bool, smem: int, deadline: float) -> tuple[GemmTiles, float, list]:
    """Best tiles of one GEMM at one BLOCK_M: stage one's grid, then other stage counts for its top 3."""
    elem = getattr(torch, layer.args.dtype).itemsize
    tried: list[tuple[float, GemmTiles]] = []
    errors = []

    def measure(cfg: GemmTiles) -> None:
        if tried and time.monotonic() > deadline:  # budget spent: the best measured so far
            return
        try:
            tried.append((layer.gemm_us(block_m, cfg, gated), cfg))
        except Exception as exc:  # noqa: BLE001 -- an out-of-resources config is skipped, and recorded
            errors.append(f"{cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")

    measure(GemmTiles())  # today's default, and the fallback if nothing else runs
    for cfg in stage_one(block_m, gated, elem, smem):
        measure(cfg)
    if time.monotonic() < deadline:
        top = [cfg for _, cfg in sorted(tried, key=lambda tc: tc[0])[:3]]
        for cfg in top:
            for stages in (2, 4, 5):
                more = GemmTiles(cfg.block_n, cfg.block_k, cfg.num_warps, stages)
                if more not in [c for _, c in tried] and fits(block_m, more, gated, elem, smem):
                    measure(more)
    best_us, best = min(tried, key=lambda tc: tc[0])
    return best, best_us, errors


def tune_tokens(args, tokens: int, smem: int, deadline: float) -> tuple[MoeTiles, dict]:
    layer = Layer(args, tokens)
    rows = {}
    for block_m in candidates_m(tokens, args.top_k, args.experts):
        gate_up, gu_us, e1 = sweep(layer, block_m, True, smem, deadline)
        down, dn_us, e2 = sweep(layer, block_m, False, smem, deadline)
        align_us = layer.align_us(block_m, triton=True)
        rows[block_m] = {"tiles": MoeTiles(block_m, gate_up, down), "gate_up_us": gu_us, "down_us": dn_us,
                         "align_triton_us": align_us, "align_torch_us": layer.align_us(block_m, triton=False),
                         "errors": e1 + e2}
    block_m = min(rows, key=lambda m: rows[m]["gate_up_us"] + rows[m]["down_us"] + rows[m]["align_triton_us"])
    best = rows[block_m]
    today = MoeTiles(block_m_for(tokens * args.top_k, args.experts))
    result = {"tokens": tokens, "distinct_experts": layer.distinct, "best": best["tiles"].to_json(),
              **{key: best[key] for key in ("gate_up_us", "down_us", "align_triton_us", "align_torch_us")},
              "gate_up_floor_frac": layer.floor_us(True) / best["gate_up_us"],
              "down_floor_frac": layer.floor_us(False) / best["down_us"],
              "call_today_us": layer.call_us(today, "torch"), "call_tuned_us": layer.call_us(best["tiles"], "triton"),
              "errors": sum((r["errors"] for r in rows.values()), [])}
    result["call_tuned_floor_frac"] = layer.floor_us(None) / result["call_tuned_us"]
    result["align_torch_share_today"] = best["align_torch_us"] / result["call_today_us"]
    del layer
    torch.cuda.empty_cache()
    return best["tiles"], result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768, help="per-rank intermediate width")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="after this, no new config is measured: a token count in progress keeps its best so far")
    parser.add_argument("--copy-tb-s", type=float, default=None, help="copy bandwidth; measured when absent")
    parser.add_argument("--out", type=Path, default=None, help="table path (default: kernels/configs/<shape>.json)")
    parser.add_argument("--report", type=Path, default=None, help="full measurements as JSON")
    parser.add_argument("--missing-only", action="store_true",
                        help="tune only the token counts the table lacks (all of them without a table), keep the rest")
    args = parser.parse_args(argv)
    begin = time.monotonic()
    deadline = begin + args.budget_s
    device = torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(0)
    smem = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
    args.bandwidth = args.copy_tb_s * 1e12 if args.copy_tb_s else measure_copy_bandwidth()
    out = args.out or table_path(args.experts, args.inter, args.dtype, device)
    kept = dict(load_table(str(out)) or ()) if args.missing_only else {}
    order = [t for t in PRIORITY if t in args.tokens] + [t for t in args.tokens if t not in PRIORITY]
    order = [t for t in order if t not in kept]
    print(f"{device}: tuning T = {order or 'nothing'}" + (f", keeping {sorted(kept)} of {out.name}" if kept else ""),
          flush=True)
    if not order:
        return
    best, results = dict(kept), []
    for tokens in order:
        if time.monotonic() > deadline:
            print(f"budget spent: T={tokens} and later keep the nearest tuned entry")
            break
        best[tokens], row = tune_tokens(args, tokens, smem, deadline)
        results.append(row)
        print(f"T={tokens:5d} {row['best']}  gate_up {row['gate_up_us']:7.1f} us ({row['gate_up_floor_frac']:.0%} "
              f"of floor)  down {row['down_us']:7.1f} us ({row['down_floor_frac']:.0%})  align torch "
              f"{row['align_torch_us']:.1f} -> triton {row['align_triton_us']:.1f} us  call "
              f"{row['call_today_us']:.1f} -> {row['call_tuned_us']:.1f} us ({row['call_tuned_floor_frac']:.0%})",
              flush=True)
    meta = {"command": "python experiments/moe/tune_fused_moe.py" + (" --missing-only" if kept else ""),
            "copy_tb_s": args.bandwidth / 1e12, "top_k": args.top_k, "hidden": args.hidden,
            "tune_s": time.monotonic() - begin, "tuned_tokens": sorted(t for t in best if t not in kept)}
    if kept:  # the kept entries' own measurements
        meta["earlier"] = json.loads(out.read_text()).get("meta")
    write_table(out, args.experts, args.inter, args.dtype, device, best, meta)
    print(f"wrote {out} ({len(best)} token counts, {len(best) - len(kept)} tuned now, {meta['tune_s']:.0f} s)")
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps({"device": device, **meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
