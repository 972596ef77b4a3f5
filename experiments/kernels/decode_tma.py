"""Does the decode kernel read the KV cache faster with bulk (TMA) copies of its K/V tiles?

Nsight Compute on the engine's decode kernel at batch 140 (`chunks_h100/ncu_decode_batch140.txt`)
shows DRAM at 84% of peak, 5 blocks per SM (96 registers a thread, 39 KB of shared memory), and
warps stalled on global loads 65% of their cycles: too few bytes in flight, with the K/V tiles
gathered row by row into registers. Here the same kernel fetches each 64- or 128-key tile of one KV
head with one tensor-memory-accelerator copy: a page holds the tile's rows at a fixed stride, so
a 4-D descriptor over the cache [block, slot, KV head, dim] with a [1, BLOCK_N, 1, dim] box reaches
it, and Triton pipelines the copies over `num_stages` buffers.

Everything else (split rule, balanced chunks, partials and their merge) is the engine's
(kernels.decode_attention). Timed as CUDA-graph replays with L2 cleared on ragged Qwen3-0.6B
batches, and checked against the float32 reference.

    python -m experiments.kernels.decode_tma --out $OUT/decode_tma
"""

from __future__ import annotations

from itertools import product

import numpy as np
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import kernels.decode_attention as decode
from kernels.decode_attention import _attend_tile, _chunk_of, _write_output
from experiments.kernels.decode_chunks import BATCHES, HEAD_DIM, KV_HEADS, RaggedBatch
from experiments.kernels.timing import decode_bandwidth_table
from kernels.decode_split import balanced_chunk, choose_num_splits
from kernels.reference import decode_attention_ref
from kernels.validation import LOG2E

TMA_CONFIGS = list(product((64, 128), (4, 8), (2, 3, 4)))  # block_n, warps, stages


@triton.jit
def _decode_tma_kernel(
    q_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr, out_ptr, mid_o_ptr, mid_lse_ptr, chunk_ptr,
    arrivals_ptr, qk_scale, num_splits, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    chunk, used = _chunk_of(seq_len, chunk_ptr, num_splits, BLOCK_N, True)
    if split < used:
        start = split * chunk
        end = tl.minimum(start + chunk, seq_len)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, HEAD_DIM)
        g_ok = g < GROUP
        heads = kvh * GROUP + g
        q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=g_ok[:, None], other=0.0)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
        bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for tile in tl.range(start, end, BLOCK_N):
            # chunks are whole tiles and BLOCK_N divides PAGE: a tile never leaves its page, and
            # the rows past `end` are in-page cache slots (finite: the probe fills the whole
            # cache), masked out of the softmax
            blk = tl.load(bt_row + tile // PAGE)
            k = k_desc.load([blk, tile % PAGE, kvh, 0]).reshape(BLOCK_N, HEAD_DIM)
            v = v_desc.load([blk, tile % PAGE, kvh, 0]).reshape(BLOCK_N, HEAD_DIM)
            m, l, acc = _attend_tile(q, k, v, tile + tl.arange(0, BLOCK_N) < end, m, l, acc, qk_scale)
        _write_output(out_ptr, mid_o_ptr, mid_lse_ptr, arrivals_ptr, m, l, acc, num_splits, stride_ot, stride_oh,
                      seq, kvh, split, heads, g_ok, d, d < HEAD_DIM, used, NUM_HEADS, GROUP, HEAD_DIM, BLOCK_G,
                      HEAD_DIM)


def tma_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, chunk, arrivals, *, num_splits: int,
               block_n: int, num_warps: int, num_stages: int) -> torch.Tensor:
    num_seqs, num_heads, head_dim = q.shape
    _, page, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    mid_o = torch.empty((num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
    box = [1, block_n, 1, head_dim]
    k_desc = TensorDescriptor(k_cache, list(k_cache.shape), list(k_cache.stride()), box)
    v_desc = TensorDescriptor(v_cache, list(v_cache.shape), list(v_cache.stride()), box)
    group = num_heads // num_kv_heads
    _decode_tma_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_desc, v_desc, block_tables, seq_lens, out, mid_o, mid_lse, chunk, arrivals, scale * LOG2E,
        num_splits, q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        NUM_HEADS=num_heads, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_N=block_n, PAGE=page, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


def one_batch(batch: int, rng: np.random.Generator) -> list[dict]:
    b = RaggedBatch.make(batch, rng)
    lens, q, k_cache, v_cache, tables, seq_lens = b.lens, b.q, b.k_cache, b.v_cache, b.tables, b.seq_lens
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # a chunk in whole tiles of each kernel's BLOCK_N, so that no tile leaves its page
    chunks = {bn: torch.tensor([balanced_chunk(lens, KV_HEADS, sms, bn)], dtype=torch.int32, device="cuda")
              for bn in (64, 128)}
    splits = choose_num_splits(batch, KV_HEADS, 4096, sms, balanced=True)
    arrivals = decode.DecodeArrivals().get(batch * KV_HEADS, q.device)
    scale = HEAD_DIM**-0.5
    reference = decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, scale)
    calls = {"engine 64/4/2": lambda: decode.paged_decode_attention(
        q, k_cache, v_cache, tables, seq_lens, scale, num_splits=splits, split_chunk=chunks[64], arrivals=arrivals)}
    for block_n, warps, stages in TMA_CONFIGS:
        calls[f"tma {block_n}/{warps}/{stages}"] = lambda bn=block_n, w=warps, s=stages: tma_decode(
            q, k_cache, v_cache, tables, seq_lens, scale, chunks[bn], arrivals, num_splits=splits, block_n=bn,
            num_warps=w, num_stages=s)
    return [{"batch": batch, "kernel": name, **b.time(call, reference)} for name, call in calls.items()]


def main(argv: list[str] | None = None) -> None:
    frame, _, out = decode_bandwidth_table(argv, __doc__.splitlines()[0], one_batch, BATCHES, "decode_tma",
                                           ceiling="read")
    wide = frame.pivot_table(index="kernel", columns="batch", values="us")
    text = f"{torch.cuda.get_device_name()}\n{frame.to_string(index=False)}\n\nus per launch:\n{wide.round(1).to_string()}\n"
    (out / "decode_tma.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
