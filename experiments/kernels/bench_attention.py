"""Microbenchmarks of the Triton decode / prefill / store kernels against PyTorch's own attention.

Reported as achieved memory bandwidth (the bytes a kernel must move at least once: K/V of the
context, q and out, over the median time) against a device-to-device copy measured in the same
run, and for prefill also as TFLOP/s against a measured bf16 matmul.

    python -m experiments.kernels.bench_attention --out experiments/kernels

Writes results_<tag>.csv (main table), sweep_<tag>.csv (split counts and tile shapes) and
summary_<tag>.md. The PyTorch baseline is scaled_dot_product_attention on K/V already dense and
contiguous (no gather), with enable_gqa; it is a reference point, not a paged implementation.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback

import pandas as pd
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention.bias import causal_lower_right

from experiments.kernels.timing import bench_graph, both, copy_ceiling, matmul_ceiling
from kernels.decode_attention import choose_num_splits, paged_decode_attention
from kernels.prefill_attention import paged_prefill_attention
from kernels.store_kvcache import store_kvcache

MODELS = {"qwen3-0.6b": (16, 8), "qwen3-8b": (32, 8)}  # (num_heads, num_kv_heads)
HEAD_DIM, BLOCK_SIZE, DTYPE = 128, 256, torch.bfloat16


def paged_kv(batch: int, ctx: int, num_kv_heads: int):
    """Random K/V for `batch` sequences of `ctx` tokens, in randomly permuted blocks, plus the
    same K/V dense [batch, kv_heads, ctx, head_dim] for SDPA."""
    per_seq = triton.cdiv(ctx, BLOCK_SIZE)
    num_blocks = batch * per_seq
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
    v_cache = torch.randn(shape, dtype=DTYPE, device="cuda")
    perm = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    tables = perm.view(batch, per_seq)
    pos = torch.arange(ctx, device="cuda")
    slots = tables.long()[:, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE  # [batch, ctx]
    flat_k = k_cache.view(-1, num_kv_heads, HEAD_DIM)
    flat_v = v_cache.view(-1, num_kv_heads, HEAD_DIM)
    dense_k = flat_k[slots].transpose(1, 2).contiguous()  # [batch, kv_heads, ctx, head_dim]
    dense_v = flat_v[slots].transpose(1, 2).contiguous()
    return k_cache, v_cache, tables, dense_k, dense_v


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_decode(rows, sweep, copy_bw, quick):
    batches = [1, 4, 16, 64, 256] if not quick else [1, 16]
    ctxs = [512, 2048, 8192] if not quick else [512, 2048]
    for model, (nh, nkv) in MODELS.items():
        for batch in batches:
            for ctx in ctxs:
                k_cache, v_cache, tables, dk, dv = paged_kv(batch, ctx, nkv)
                seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
                q = torch.randn(batch, nh, HEAD_DIM, dtype=DTYPE, device="cuda")
                scale = HEAD_DIM**-0.5
                nbytes = 2 * batch * ctx * nkv * HEAD_DIM * 2 + 2 * q.numel() * 2
                splits = choose_num_splits(batch, nkv, ctx, torch.cuda.get_device_properties(0).multi_processor_count)

                def tri(ns=None, **cfg):
                    return paged_decode_attention(
                        q, k_cache, v_cache, tables, seq_lens, scale,
                        max_seq_len_hint=ctx, num_splits=ns, **cfg,
                    )  # fmt: skip

                q4 = q.unsqueeze(2)  # [batch, heads, 1, head_dim]

                def sdpa():
                    return F.scaled_dot_product_attention(q4, dk, dv, scale=scale, enable_gqa=True)

                err = rel_err(tri(), sdpa().squeeze(2))
                for impl, fn in (("triton", tri), ("torch_sdpa_dense", sdpa)):
                    ms, gms = both(fn)
                    rows.append(dict(
                        kernel="decode", impl=impl, model=model, batch=batch, q_len=1, ctx=ctx,
                        num_splits=splits if impl == "triton" else None, config="default",
                        time_us=ms * 1e3, time_us_graph=gms * 1e3, bytes=nbytes,
                        gbps_graph=nbytes / gms / 1e6, frac_of_copy=nbytes / (ms * 1e-3) / copy_bw,
                        frac_of_copy_graph=nbytes / (gms * 1e-3) / copy_bw, tflops=None,
                        rel_err_vs_sdpa=err if impl == "triton" else None,
                    ))  # fmt: skip
                if model == "qwen3-8b" and batch <= 16:
                    for ns in (1, 2, 4, 8, 16, 32, 64):
                        ms = bench_graph(lambda: tri(ns))
                        sweep.append(dict(kernel="decode", model=model, batch=batch, ctx=ctx,
                                          num_splits=ns, config="default", time_us=ms * 1e3,
                                          frac_of_copy=nbytes / (ms * 1e-3) / copy_bw))  # fmt: skip
                if model == "qwen3-8b" and batch in (1, 64) and ctx == 8192:
                    for bn, nw, st in ((32, 4, 2), (64, 4, 3), (64, 8, 2), (128, 4, 2), (128, 8, 3)):
                        ms = bench_graph(lambda: tri(None, block_n=bn, num_warps=nw, num_stages=st))
                        sweep.append(dict(kernel="decode", model=model, batch=batch, ctx=ctx,
                                          num_splits=splits, config=f"bn{bn}_w{nw}_s{st}",
                                          time_us=ms * 1e3,
                                          frac_of_copy=nbytes / (ms * 1e-3) / copy_bw))  # fmt: skip
                k_cache = v_cache = dk = dv = None  # free before the next shape
                torch.cuda.empty_cache()
                print(f"decode {model} b={batch} ctx={ctx}: graph {rows[-2]['time_us_graph']:.1f}us "
                      f"({rows[-2]['frac_of_copy_graph']:.0%} of copy) vs sdpa "
                      f"{rows[-1]['time_us_graph']:.1f}us; eager {rows[-2]['time_us']:.1f} vs "
                      f"{rows[-1]['time_us']:.1f}; splits {splits}, err {err:.1e}", flush=True)  # fmt: skip


def prefill_flops(batch, q_len, ctx, nh):
    # query j sees ctx - q_len + j + 1 keys; QK^T and PV are 2 * head_dim flops per key each
    keys = q_len * (ctx - q_len) + q_len * (q_len + 1) / 2
    return batch * nh * 4 * HEAD_DIM * keys


def run_prefill(rows, sweep, copy_bw, mm_flops, quick):
    shapes = [(1, 2048, 2048), (4, 1024, 1024), (1, 8192, 8192), (1, 512, 4096), (8, 512, 2048)]
    if quick:
        shapes = shapes[:2]
    for model, (nh, nkv) in MODELS.items():
        for batch, q_len, ctx in shapes:
            k_cache, v_cache, tables, dk, dv = paged_kv(batch, ctx, nkv)
            q = torch.randn(batch * q_len, nh, HEAD_DIM, dtype=DTYPE, device="cuda")
            qsl = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * q_len
            seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
            scale = HEAD_DIM**-0.5
            nbytes = 2 * batch * ctx * nkv * HEAD_DIM * 2 + 2 * q.numel() * 2
            flops = prefill_flops(batch, q_len, ctx, nh)

            def tri(**cfg):
                return paged_prefill_attention(
                    q, k_cache, v_cache, qsl, seq_lens, tables, q_len, scale, **cfg
                )

            q4 = q.view(batch, q_len, nh, HEAD_DIM).transpose(1, 2)  # [batch, heads, q_len, dim]
            mask = causal_lower_right(q_len, ctx) if q_len != ctx else None
            if mask is not None:
                # NOTE: the lower-right causal bias may not take enable_gqa: expand K/V up front
                dk = dk.repeat_interleave(nh // nkv, 1)
                dv = dv.repeat_interleave(nh // nkv, 1)

            def sdpa():
                if mask is None:
                    return F.scaled_dot_product_attention(
                        q4, dk, dv, is_causal=True, scale=scale, enable_gqa=True
                    )
                return F.scaled_dot_product_attention(q4, dk, dv, attn_mask=mask, scale=scale)

            err = rel_err(tri(), sdpa().transpose(1, 2).reshape(-1, nh, HEAD_DIM))
            for impl, fn in (("triton", tri), ("torch_sdpa_dense", sdpa)):
                ms, gms = both(fn)
                rows.append(dict(
                    kernel="prefill", impl=impl, model=model, batch=batch, q_len=q_len, ctx=ctx,
                    num_splits=None, config="default", time_us=ms * 1e3, time_us_graph=gms * 1e3,
                    bytes=nbytes, gbps_graph=nbytes / gms / 1e6,
                    frac_of_copy=nbytes / (ms * 1e-3) / copy_bw,
                    frac_of_copy_graph=nbytes / (gms * 1e-3) / copy_bw,
                    tflops=flops / (ms * 1e-3) / 1e12, tflops_graph=flops / (gms * 1e-3) / 1e12,
                    rel_err_vs_sdpa=err if impl == "triton" else None,
                ))  # fmt: skip
            if (batch, q_len) in ((1, 2048), (1, 512), (1, 8192)):
                for bm, bn, nw, st in ((128, 64, 8, 2), (64, 64, 4, 3), (128, 128, 8, 2),
                                       (64, 32, 4, 2), (64, 128, 4, 2), (128, 64, 4, 3),
                                       (128, 32, 4, 2)):  # fmt: skip
                    ms = bench_graph(lambda: tri(block_m=bm, block_n=bn, num_warps=nw, num_stages=st))
                    sweep.append(dict(kernel="prefill", model=model, batch=batch, ctx=ctx,
                                      q_len=q_len, config=f"bm{bm}_bn{bn}_w{nw}_s{st}",
                                      time_us=ms * 1e3, tflops=flops / (ms * 1e-3) / 1e12))  # fmt: skip
            k_cache = v_cache = dk = dv = None  # free before the next shape
            torch.cuda.empty_cache()
            print(f"prefill {model} b={batch} q={q_len} ctx={ctx}: graph "
                  f"{rows[-2]['tflops_graph']:.0f} TFLOP/s "
                  f"({rows[-2]['tflops_graph'] * 1e12 / mm_flops:.0%} of matmul) vs sdpa "
                  f"{rows[-1]['tflops_graph']:.0f}; eager {rows[-2]['tflops']:.0f} vs "
                  f"{rows[-1]['tflops']:.0f}, err {err:.1e}", flush=True)  # fmt: skip


def run_store(rows, copy_bw):
    for num_tokens in (256, 8192):
        nkv = 8
        k = torch.randn(num_tokens, nkv, HEAD_DIM, dtype=DTYPE, device="cuda")
        v = torch.randn_like(k)
        num_blocks = 4 * num_tokens // BLOCK_SIZE + 4
        k_cache = torch.empty(num_blocks, BLOCK_SIZE, nkv, HEAD_DIM, dtype=DTYPE, device="cuda")
        v_cache = torch.empty_like(k_cache)
        slots = torch.randperm(num_blocks * BLOCK_SIZE, device="cuda")[:num_tokens]
        nbytes = 4 * k.numel() * 2  # read k and v, write both
        ms, gms = both(lambda: store_kvcache(k, v, k_cache, v_cache, slots))
        rows.append(dict(kernel="store_kvcache", impl="triton", model="kv8_d128", batch=num_tokens,
                         q_len=None, ctx=None, num_splits=None, config="default",
                         time_us=ms * 1e3, time_us_graph=gms * 1e3, bytes=nbytes,
                         gbps_graph=nbytes / gms / 1e6, frac_of_copy=nbytes / (ms * 1e-3) / copy_bw,
                         frac_of_copy_graph=nbytes / (gms * 1e-3) / copy_bw, tflops=None,
                         rel_err_vs_sdpa=None))  # fmt: skip


def _cell(x) -> str:
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() and abs(x) >= 100 else f"{x:.3g}"
    return str(x)


def md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(x) for x in r) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="experiments/kernels")
    ap.add_argument("--tag", default="h100")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    copy_bw = copy_ceiling()
    mm_flops = matmul_ceiling()
    print(f"{props.name}: copy {copy_bw / 1e12:.2f} TB/s, bf16 matmul {mm_flops / 1e12:.0f} TFLOP/s", flush=True)
    rows, sweep = [], []
    # one failing section must not lose the others' numbers
    for section in (
        lambda: run_store(rows, copy_bw),
        lambda: run_decode(rows, sweep, copy_bw, args.quick),
        lambda: run_prefill(rows, sweep, copy_bw, mm_flops, args.quick),
    ):
        try:
            section()
        except Exception:  # noqa: BLE001 - report and go on
            traceback.print_exc()
            torch.cuda.empty_cache()
    res = pd.DataFrame(rows)
    res.to_csv(os.path.join(args.out, f"results_{args.tag}.csv"), index=False)
    pd.DataFrame(sweep).to_csv(os.path.join(args.out, f"sweep_{args.tag}.csv"), index=False)
    write_summary(res, args.out, args.tag, copy_bw, mm_flops)
    print(f"bench done in {time.time() - t0:.0f}s", flush=True)


def write_summary(res: pd.DataFrame, out: str, tag: str, copy_bw: float, mm_flops: float) -> None:
    props = torch.cuda.get_device_properties(0)
    short = {"triton": "tri", "torch_sdpa_dense": "sdpa"}
    dec = res[res.kernel == "decode"].pivot_table(
        index=["model", "batch", "ctx"], columns="impl",
        values=["time_us_graph", "frac_of_copy_graph", "time_us"],
    )  # fmt: skip
    dec.columns = [f"{a}_{short[b]}" for a, b in dec.columns]
    pre = res[res.kernel == "prefill"].pivot_table(
        index=["model", "batch", "q_len", "ctx"], columns="impl",
        values=["time_us_graph", "tflops_graph", "time_us"],
    )  # fmt: skip
    pre.columns = [f"{a}_{short[b]}" for a, b in pre.columns]
    store = res[res.kernel == "store_kvcache"][
        ["batch", "time_us", "time_us_graph", "gbps_graph", "frac_of_copy_graph"]
    ]
    with open(os.path.join(out, f"summary_{tag}.md"), "w") as f:
        f.write(f"# Attention kernel microbenchmarks ({tag})\n\n")
        f.write(f"- device: {props.name}, {props.multi_processor_count} SMs\n")
        f.write(f"- date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}\n")
        f.write(f"- torch {torch.__version__}, triton {triton.__version__}\n")
        f.write(f"- command: `python {' '.join(sys.argv)}`\n")
        f.write(f"- measured copy ceiling: {copy_bw / 1e12:.2f} TB/s (read + write); "
                f"bf16 8192^3 matmul: {mm_flops / 1e12:.0f} TFLOP/s\n")  # fmt: skip
        f.write("- bytes counted: K/V of the context once + q + out; time: do_bench median, L2 "
                "cleared before each call; `_graph` columns time one CUDA-graph replay (GPU time, "
                "as the engine runs decode), plain `time_us` the eager call (Python launch "
                "overhead included)\n\n")  # fmt: skip
        f.write("## Decode (bf16, head_dim 128, block 256)\n\n" + md_table(dec.reset_index()) + "\n\n")
        f.write("## Prefill\n\n" + md_table(pre.reset_index()) + "\n\n")
        f.write("## store_kvcache (tokens x 8 kv heads x 128)\n\n" + md_table(store) + "\n")
    print(md_table(dec.reset_index()))
    print(md_table(pre.reset_index()))


if __name__ == "__main__":
    main()
