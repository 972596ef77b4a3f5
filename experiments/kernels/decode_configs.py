"""Which tile shape of the decode kernel reads the KV cache fastest on the bench's batches?

Times kernels.decode_attention (CUDA-graph replay, L2 cleared, balanced chunks as the engine runs
it) for BLOCK_N x warps x stages on ragged Qwen3-0.6B batches (16 query / 8 KV heads, d 128,
256-token pages, contexts uniform in 100-2,000), over a bf16 and an fp8 KV cache
(CacheConfig.kv_cache_dtype), and reports each one's read bandwidth (K and V of the context once)
beside the measured copy ceiling.

    python -m experiments.kernels.decode_configs --out $OUT/decode_configs
"""

from __future__ import annotations

from itertools import product

import numpy as np
import torch

import kernels.decode_attention as decode
from experiments.kernels.timing import bench_graph, decode_bandwidth_table
from kernels.decode_split import balanced_chunk

HEADS, KV_HEADS, HEAD_DIM, PAGE, MAX_LEN = 16, 8, 128, 256, 4096
BATCHES = (64, 140, 256)
CONFIGS = list(product((32, 64, 128, 256), (4, 8), (2, 3, 4)))  # block_n, warps, stages
KV_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def one_batch(batch: int, rng: np.random.Generator) -> list[dict]:
    lens = rng.integers(100, 2001, size=batch)
    blocks_per_seq = MAX_LEN // PAGE
    k_cache = torch.randn(batch * blocks_per_seq, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(batch * blocks_per_seq, device="cuda", dtype=torch.int32).view(batch, blocks_per_seq)
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    chunk = torch.tensor([balanced_chunk(lens, KV_HEADS, torch.cuda.get_device_properties(0).multi_processor_count)],
                         dtype=torch.int32, device="cuda")
    arrivals = decode.DecodeArrivals()
    rows = []
    for kv_dtype, (block_n, warps, stages) in product(KV_DTYPES, CONFIGS):
        read_bytes = 2 * int(lens.sum()) * KV_HEADS * HEAD_DIM * kv_dtype.itemsize
        k, v = k_cache.to(kv_dtype), v_cache.to(kv_dtype)

        def call(bn=block_n, w=warps, s=stages, k=k, v=v):
            return decode.paged_decode_attention(q, k, v, tables, seq_lens, HEAD_DIM**-0.5,
                                                 max_seq_len_hint=MAX_LEN, split_chunk=chunk, block_n=bn,
                                                 num_warps=w, num_stages=s,
                                                 arrivals=arrivals.get(batch * KV_HEADS, q.device))
        try:
            call()
            ms = bench_graph(call)
        except Exception as exc:  # noqa: BLE001 - a shape that does not compile (shared memory) is reported
            print(f"batch {batch} {block_n}/{warps}/{stages}: {type(exc).__name__}", flush=True)
            ms = float("nan")
        rows.append({"batch": batch, "kv_dtype": str(kv_dtype).removeprefix("torch."), "block_n": block_n,
                     "warps": warps, "stages": stages, "us": ms * 1e3,
                     "read_tb_s": read_bytes / (ms * 1e-3) / 1e12})
    return rows


def main(argv=None) -> None:
    frame, ceiling, out = decode_bandwidth_table(argv, __doc__.splitlines()[0], one_batch, BATCHES, "decode_configs")
    best = frame.loc[frame.groupby(["batch", "kv_dtype"]).us.idxmin()]
    default = frame[(frame.block_n == 64) & (frame.warps == 4) & (frame.stages == 2)]
    text = (f"copy ceiling {ceiling:.2f} TB/s\ndefault (64/4/2):\n{default.to_string(index=False)}\n"
            f"best per batch:\n{best.to_string(index=False)}\n")
    (out / "decode_configs.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
