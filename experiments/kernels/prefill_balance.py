"""How fast does one program of the prefill attention kernel walk its keys? The rate the profiled
model's prefill program term prices (sim.prefill_programs; docs/prefill-programs.md).

Times the engine's prefill kernel (kernels.prefill_attention: one program per sequence, KV head and
query tile, each walking its cached keys then its causal part) as one CUDA-graph replay with L2
cleared, launched through a tile map as a prefill graph does ("graph") and directly as an eager
step does ("eager"), over sequences 1-64, chunks of 16-2,048 tokens and 0-8,192 cached tokens a
sequence. Each shape's programs and their term come from sim.prefill_programs (the simulator's own
rule); the fit, per launch kind, is one layer's kernel time

    us = c0 + w * (program keys / slots) + excess_keys / rate

(c0: the launch; w: a key's price while the programs fill the GPU; excess_keys: one layer's share
of the term; rate: keys/s of one program walking alone). 1 / rate is the seconds per key that a
grid fit's prefill_program_keys coefficient estimates (both per layer, summed over layers there).

    python -m experiments.kernels.prefill_balance --out $OUT/prefill_balance     # on a GPU, <= 120 s
    python -m experiments.kernels.prefill_balance --out /tmp/pb --dry-run         # CPU: shapes, planted fit

Writes kernel.csv (a row per shape and launch: us, programs, keys, excess) as it goes, and fit.csv
(c0_us, w_us_per_key, rate_keys_per_s, seconds_per_key, rows, median_abs_rel_error per launch).
--dry-run times nothing: it prices each shape with a planted rate and checks the fit recovers it.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from sim.prefill_programs import PrefillPrograms

SEQS = (1, 2, 4, 8, 16, 32, 64)
CHUNKS = (16, 64, 256, 1024, 2048)
CACHED = (0, 512, 2048, 8192)
PAGE, HEAD_DIM, SLOTS_PER_SM = 256, 128, 2
MAX_TOKENS = 16384  # the engine's max_num_batched_tokens: bigger steps are not served
PLANTED_RATE = 4.2e7  # --dry-run's keys/s (the H200 grid fit's: 2.4e-8 s a key)


def shapes() -> list[tuple[int, int, int]]:
    """(sequences, chunk tokens, cached tokens) a sequence, within a served step's token budget."""
    return [(s, n, c) for s, n, c in itertools.product(SEQS, CHUNKS, CACHED) if s * n <= MAX_TOKENS]


def programs_row(kernel: PrefillPrograms, seqs: int, chunk: int, cached: int, graph: bool) -> dict:
    keys = kernel.launch_keys([chunk] * seqs, [cached] * seqs, graph)
    excess = kernel.excess_keys([chunk] * seqs, [cached] * seqs, graph) / kernel.num_layers
    return {"seqs": seqs, "chunk": chunk, "cached": cached, "launch": "graph" if graph else "eager",
            "programs": int(keys.size), "keys": float(keys.sum()), "even_keys": float(keys.sum()) / kernel.slots,
            "excess_keys": excess}


def fit(rows: pd.DataFrame) -> pd.DataFrame:
    """The model of the module doc, least squares on relative error, per launch kind."""
    out = []
    for launch, part in rows.dropna(subset=["us"]).groupby("launch"):
        x = np.column_stack([np.ones(len(part)), part["even_keys"], part["excess_keys"]])
        y = part["us"].to_numpy()
        coef, *_ = np.linalg.lstsq(x / y[:, None], np.ones(len(part)), rcond=None)
        error = x @ coef / y - 1
        per_key_s = coef[2] * 1e-6
        out.append({"launch": launch, "c0_us": coef[0], "w_us_per_key": coef[1],
                    "rate_keys_per_s": 1 / per_key_s if per_key_s > 0 else float("nan"),
                    "seconds_per_key": per_key_s, "rows": len(part),
                    "median_abs_rel_error": float(np.median(np.abs(error)))})
    return pd.DataFrame(out)


def paged_inputs(seqs: int, chunk: int, cached: int, heads: int, kv_heads: int) -> dict:
    """Random bf16 inputs of the prefill kernel on the GPU for `seqs` sequences of `chunk` new tokens
    after `cached` cached ones each, their pages shuffled over the cache, and the tile map its graph
    launch reads: paged_prefill_attention's arguments by name, tiles apart."""
    import torch
    import triton

    from kernels.prefill_tiles import query_tiles, tile_shape

    total = cached + chunk
    per_seq = triton.cdiv(total, PAGE)
    shape = (seqs * per_seq, PAGE, kv_heads, HEAD_DIM)
    block_q = tile_shape(heads // kv_heads, chunk).block_q
    tile_seq, tile_start = query_tiles(np.full(seqs, chunk), np.full(seqs, total), block_q)
    return {"q": torch.randn((seqs * chunk, heads, HEAD_DIM), dtype=torch.bfloat16, device="cuda"),
            "k_cache": torch.randn(shape, dtype=torch.bfloat16, device="cuda"),
            "v_cache": torch.randn(shape, dtype=torch.bfloat16, device="cuda"),
            "query_start_loc": torch.arange(seqs + 1, dtype=torch.int32, device="cuda") * chunk,
            "seq_lens": torch.full((seqs,), total, dtype=torch.int32, device="cuda"),
            "block_tables": torch.randperm(seqs * per_seq, device="cuda", dtype=torch.int32).reshape(seqs, per_seq),
            "max_query_len": chunk, "scale": HEAD_DIM**-0.5,
            "map": (torch.from_numpy(tile_seq).cuda(), torch.from_numpy(tile_start).cuda())}


def time_shape(kernel: PrefillPrograms, seqs: int, chunk: int, cached: int, graph: bool, heads: int) -> float:
    """Microseconds of one launch of the engine's prefill kernel on this shape (one layer)."""
    from experiments.kernels.timing import bench_graph
    from kernels.prefill_attention import paged_prefill_attention

    inputs = paged_inputs(seqs, chunk, cached, heads, kernel.num_kv_heads)
    tiles = inputs.pop("map")
    return 1e3 * bench_graph(lambda: paged_prefill_attention(**inputs, tiles=tiles if graph else None))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--heads", type=int, default=16, help="query heads (Qwen3-0.6B: 16; Qwen3-8B: 32)")
    parser.add_argument("--kv-heads", type=int, default=8, help="KV heads (Qwen3: 8)")
    parser.add_argument("--budget-s", type=float, default=100.0, help="stop timing after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: planted timings, to check the fit")
    args = parser.parse_args(argv)
    if args.heads < 1 or args.kv_heads < 1 or args.heads % args.kv_heads:
        raise SystemExit(f"error: --heads ({args.heads}) must be a positive multiple of --kv-heads ({args.kv_heads})")
    if not args.budget_s > 0:
        raise SystemExit(f"error: --budget-s must be > 0, got {args.budget_s}")
    sms = 132
    if not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("error: no CUDA device (use --dry-run on a CPU)")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel = PrefillPrograms(args.kv_heads, args.heads // args.kv_heads, 1, sms, SLOTS_PER_SM)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.monotonic()
    for i, (seqs, chunk, cached) in enumerate(shapes()):
        for graph in (True, False):
            row = programs_row(kernel, seqs, chunk, cached, graph)
            if args.dry_run:  # a planted law: launch, even work, the longest programs' wait
                row["us"] = 4.0 + 0.004 * row["even_keys"] + 1e6 * row["excess_keys"] / PLANTED_RATE
            else:
                row["us"] = time_shape(kernel, seqs, chunk, cached, graph, args.heads)
            rows.append(row)
        if i % 10 == 0 or time.monotonic() - start > args.budget_s:
            pd.DataFrame(rows).to_csv(args.out / "kernel.csv", index=False)  # survives a timeout
            print(f"[prefill_balance] {i + 1}/{len(shapes())} shapes, {time.monotonic() - start:.0f} s", flush=True)
        if time.monotonic() - start > args.budget_s:
            print(f"[prefill_balance] --budget-s {args.budget_s:g} reached: fitting what was timed", flush=True)
            break
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "kernel.csv", index=False)
    fitted = fit(table)
    fitted.to_csv(args.out / "fit.csv", index=False)
    print(fitted.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
