"""Does a ragged decode batch cost more than an even one with the same total context?

Served decode steps of Qwen3-0.6B at batch 33-64 ran 10-13% slower than the profiled grid
predicted (calibration run 4), while the grid's batches have nearly even contexts. With
max_model_len 4096 the captured graphs of those batches use one split (>= 2 programs per SM), so
each (sequence, KV head) program walks its whole context and the longest sequence can hold the
step. This probe times the decode kernel on even and ragged batches of equal total context, for
the split count the kernel picks and for split counts that cap a program's walk at C keys
(S = max(picked, ceil(4096 / C))), for the balanced chunks of kernels.decode_split (the batch's
fair share per program; launches with room for ceil(4096 / BALANCE_CHUNK) splits, or for 8), and
with --ckpt the whole graph decode step of the model with EngineConfig.balanced_decode off and on.

    python -m experiments.kernels.decode_balance --out $OUT/balance [--model qwen3-0.6b] [--batches 72 80 ...]

Writes kernel.csv (and step.csv with --ckpt) and prints them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import triton

import kernels.decode_attention as decode
from experiments.kernels.balance_shapes import contexts
from experiments.kernels.timing import bench_graph
from harness.scripting import probe_args, probe_parser
from kernels.decode_split import balanced_chunk

MAX_MODEL_LEN, BLOCK_SIZE, HEAD_DIM = 4096, 256, 128
BATCHES = (8, 16, 32, 48, 64, 96, 128, 256, 512)
STEP_BATCHES = (16, 32, 48, 64, 96, 128, 256)  # --ckpt's whole steps
CAPS = (256, 512, 1024)


def split_variants(batch: int, num_kv_heads: int, sms: int, max_model_len: int) -> dict[str, tuple[int, bool]]:
    """name -> (split count, balanced chunk or not)"""
    picked = decode.choose_num_splits(batch, num_kv_heads, max_model_len, sms)
    out = {"picked": (picked, False)}
    for cap in CAPS:
        out[f"cap{cap}"] = (min(64, max(picked, triton.cdiv(max_model_len, cap))), False)
    out["balanced"] = (decode.choose_num_splits(batch, num_kv_heads, max_model_len, sms, True), True)
    out["balanced_s8"] = (max(8, out["balanced"][0]), True)
    return out


def kernel_rows(num_heads: int, num_kv_heads: int, rng: np.random.Generator,
                max_model_len: int = MAX_MODEL_LEN, batches: tuple[int, ...] = BATCHES) -> list[dict]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for batch in batches:
        for kind in ("even", "ragged", "tail"):
            lens = contexts(kind, batch, rng)
            blocks_per_seq = triton.cdiv(max_model_len, BLOCK_SIZE)
            num_blocks = sum(triton.cdiv(c, BLOCK_SIZE) for c in lens)
            shape = (num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
            k_cache = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
            v_cache = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
            perm = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
            tables = torch.zeros((batch, blocks_per_seq), dtype=torch.int32, device="cuda")
            at = 0
            for i, c in enumerate(lens):
                n = triton.cdiv(c, BLOCK_SIZE)
                tables[i, :n] = perm[at:at + n]
                at += n
            seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn((batch, num_heads, HEAD_DIM), dtype=torch.bfloat16, device="cuda")
            fair = balanced_chunk(np.array(lens), num_kv_heads, sms)
            chunk = torch.tensor([fair], dtype=torch.int32, device="cuda")
            for name, (splits, balanced) in split_variants(batch, num_kv_heads, sms, max_model_len).items():
                # the caches are bound as defaults: the names are deleted below, after the timing
                ms = bench_graph(lambda s=splits, c=chunk if balanced else None, k=k_cache, v=v_cache:
                                 decode.paged_decode_attention(q, k, v, tables, seq_lens, HEAD_DIM**-0.5,
                                                               num_splits=s, split_chunk=c))
                rows.append({"batch": batch, "contexts": kind, "total_context": sum(lens),
                             "max_context": max(lens), "variant": name, "splits": splits,
                             "chunk": fair if balanced else None, "us": 1e3 * ms})
            del k_cache, v_cache
    return rows


def step_rows(ckpt: str, rng: np.random.Generator, batches: tuple[int, ...] = STEP_BATCHES) -> list[dict]:
    """Whole graph decode steps, balanced_decode off and on: even vs ragged batches."""
    import statistics

    from harness.calibration.profiling import time_plan_overlapped
    from harness.scripting import open_probe_engine, probe_grid, probe_plan

    grid = probe_grid()
    shapes = [(b, k, contexts(k, b, rng)) for b in batches for k in ("even", "ragged", "tail")]
    rows = []
    for variant in ("even", "balanced"):
        executor, sched = open_probe_engine(ckpt, 1500, max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                                            balanced_decode=variant == "balanced")
        try:
            for batch, kind, lens in shapes:
                plan = probe_plan(executor, sched, [(1, c, True) for c in lens])
                if plan is None:
                    continue
                t = time_plan_overlapped(executor, plan, grid)
                rows.append({"variant": variant, "batch": batch, "contexts": kind, "total_context": sum(lens),
                             "max_context": max(lens), "span_ms": 1e3 * statistics.median(t.durations),
                             "gpu_ms": None if t.gpu_s is None else 1e3 * t.gpu_s})
        finally:
            executor.shutdown()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0] + " (--ckpt or --model: also time whole graph decode steps)",
                          needs_checkpoint=False)
    # --max-model-len: the launch's room (graphs capture for it); contexts stay as they are
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help=f"decode batch sizes, in this order (the contexts are drawn in it; default: "
                             f"{BATCHES} for the kernel, {STEP_BATCHES} for whole steps)")
    args = probe_args(parser, argv)
    if args.batches is not None and any(b < 1 for b in args.batches):
        parser.error(f"--batches must be >= 1, got {args.batches}")
    out = args.out
    rng = np.random.default_rng(0)
    kernel = pd.DataFrame(kernel_rows(16, 8, rng, args.max_model_len, tuple(args.batches or BATCHES)))
    name = "kernel.csv" if args.max_model_len == MAX_MODEL_LEN else f"kernel_max_model_len_{args.max_model_len}.csv"
    kernel.to_csv(out / name, index=False)
    wide = kernel.pivot_table(index=["batch", "contexts"], columns="variant", values="us")
    print(wide.round(1).to_string(), flush=True)
    if args.ckpt:
        step = pd.DataFrame(step_rows(args.ckpt, rng, tuple(args.batches or STEP_BATCHES)))
        step.to_csv(out / "step.csv", index=False)
        print(step.pivot_table(index=["batch", "contexts"], columns="variant", values="gpu_ms").round(3).to_string())


if __name__ == "__main__":
    main()
