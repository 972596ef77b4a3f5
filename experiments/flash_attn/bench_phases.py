"""FlashAttention-4 against the project's Triton kernels, per phase, on the engine's paged cache:
the measurement behind `auto`'s routing (engine/attention/phases.py).

    python experiments/flash_attn/bench_phases.py --out $OUT

Decode: batches of one query per sequence over a ragged context (uniform in [ctx/2, 3ctx/2]),
each attention call captured in a CUDA graph and timed by its replays (decode steps replay
graphs). Prefill: a step of `tokens` query tokens split over sequences of 512-token chunks that
follow `ctx` cached tokens each, timed eagerly (launch cost included, as an eager engine step pays
it) and from a graph (device time). Qwen3-0.6B (16 query / 8 KV heads) and Qwen3-8B (32 / 8),
head_dim 128, bfloat16, 256-token blocks. Writes phases.csv; prints the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import triton

from engine.attention.flash_attn_backend import FlashAttnBackend
from engine.attention.metadata import make_metadata, slot_mapping_for
from engine.attention.triton_backend import TritonAttentionBackend
from kernels.decode_split import balanced_chunk

MODELS = {"qwen3-0.6b": (16, 8), "qwen3-8b": (32, 8)}
HEAD_DIM, BLOCK, DTYPE = 128, 256, torch.bfloat16


def _batch(query_lens, seq_lens, num_heads, num_kv_heads, rng):
    tables, slots, first = [], [], 0
    for q, s in zip(query_lens, seq_lens):
        n = -(-s // BLOCK)
        tables.append(list(range(first, first + n)))
        slots.append(slot_mapping_for(tables[-1], s - q, s, BLOCK))
        first += n
    meta = make_metadata(query_lens, seq_lens, tables, np.concatenate(slots), "cuda")
    tokens = sum(query_lens)
    cache = lambda: torch.randn(first + 1, BLOCK, num_kv_heads, HEAD_DIM, device="cuda", dtype=DTYPE)  # noqa: E731
    q = torch.randn(tokens, num_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
    k = torch.randn(tokens, num_kv_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
    return q, k, torch.randn_like(k), cache(), cache(), meta


def _time(backend, args, graph: bool) -> float:
    fn = lambda: backend.forward(*args, HEAD_DIM**-0.5)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    flash, triton_backend = FlashAttnBackend(), TritonAttentionBackend()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    rng = np.random.default_rng(0)
    rows = []
    for model, (heads, kv_heads) in MODELS.items():
        for batch in (1, 8, 32, 64, 128, 256, 512):
            for ctx in (256, 1024, 4096, 16384):
                if batch * ctx > 256 * 4096:
                    continue
                lens = rng.integers(ctx // 2, ctx * 3 // 2 + 1, batch).tolist()
                q, k, v, kc, vc, meta = _batch([1] * batch, lens, heads, kv_heads, rng)
                meta.decode_chunk = torch.tensor([balanced_chunk(np.array(lens), kv_heads, num_sms)],
                                                 dtype=torch.int32, device="cuda")
                for name, be in (("flash_attn", flash), ("triton", triton_backend)):
                    ms = _time(be, (q, k, v, kc, vc, meta), graph=True)
                    rows.append(dict(model=model, phase="decode", batch=batch, ctx=ctx, tokens=batch,
                                     backend=name, mode="graph", ms=ms))
        for tokens in (512, 2048, 8192):
            for ctx in (0, 2048, 8192):
                seqs = max(1, tokens // 512)
                q_lens = [tokens // seqs] * seqs
                q, k, v, kc, vc, meta = _batch(q_lens, [ctx + n for n in q_lens], heads, kv_heads, rng)
                for name, be in (("flash_attn", flash), ("triton", triton_backend)):
                    for graph in (False, True):
                        ms = _time(be, (q, k, v, kc, vc, meta), graph=graph)
                        rows.append(dict(model=model, phase="prefill", batch=seqs, ctx=ctx, tokens=tokens,
                                         backend=name, mode="graph" if graph else "eager", ms=ms))
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "phases.csv", index=False)
    wide = frame.pivot_table(index=["model", "phase", "mode", "batch", "ctx", "tokens"], columns="backend",
                             values="ms").reset_index()
    wide["flash_over_triton"] = wide["flash_attn"] / wide["triton"]
    print(wide.to_string(index=False, float_format=lambda x: f"{x:.4f}"))


if __name__ == "__main__":
    main()
