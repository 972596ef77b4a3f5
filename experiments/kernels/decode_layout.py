"""Does the decode kernel read the KV cache faster with another program order or cache layout?

The engine's decode kernel (kernels.decode_attention) launches programs sequence-fastest over a
cache laid out [block, slot, KV head, head_dim] ("nhd"): one program reads 256-byte rows spaced
num_kv_heads * 256 bytes apart, and the programs that read the rest of those rows (the other KV
heads of the same sequence) run num_seqs programs later. This times, on ragged Qwen3-0.6B batches
(CUDA-graph replay, L2 cleared, balanced chunks as the engine runs them):

- order "seq" (the engine's) against "head" (a sequence's KV heads launched side by side);
- layout "nhd" against "hnd" ([block, KV head, slot, head_dim]: each program's rows contiguous),
  passed to the same kernel body as strides;
- block tables shuffled or in order (a fresh engine hands blocks out mostly in order).

    python -m experiments.kernels.decode_layout --out $OUT/decode_layout
"""

from __future__ import annotations

from itertools import product

import numpy as np
import torch
import triton
import triton.language as tl

from experiments.kernels.timing import bench_graph, decode_bandwidth_table
from kernels.decode_attention import _chunk_of, _decode_split_body
from kernels.decode_split import balanced_chunk, choose_num_splits
from kernels.validation import LOG2E

HEADS, KV_HEADS, HEAD_DIM, PAGE, MAX_LEN = 16, 8, 128, 256, 4096
BATCHES = (64, 140, 256)
TILES = ((64, 4, 2), (128, 4, 3))  # block_n, warps, stages


@triton.jit
def _decode_any_order(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, mid_o_ptr, mid_lse_ptr, chunk_ptr, arrivals_ptr,
    qk_scale, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, HAS_CHUNK: tl.constexpr, HEADS_FIRST: tl.constexpr,
):  # fmt: skip
    if HEADS_FIRST:
        kvh = tl.program_id(0)
        seq = tl.program_id(1)
    else:
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    chunk, used = _chunk_of(seq_len, chunk_ptr, num_splits, BLOCK_N, HAS_CHUNK)
    if split < used:
        _decode_split_body(
            q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
            arrivals_ptr, qk_scale, num_splits, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
            stride_cb, stride_cs, stride_ch, seq, kvh, split, seq_len, chunk, used,
            NUM_HEADS, GROUP, BLOCK_G, HEAD_DIM, BLOCK_D, BLOCK_N, PAGE,
        )  # fmt: skip


def make_cache(num_blocks: int, layout: str) -> torch.Tensor:
    """[num_blocks, PAGE, KV_HEADS, HEAD_DIM] as the kernel indexes it, stored in `layout`."""
    if layout == "nhd":
        return torch.randn(num_blocks, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    stored = torch.randn(num_blocks, KV_HEADS, PAGE, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    return stored.transpose(1, 2)


def launcher(q, k_cache, v_cache, tables, seq_lens, chunk, heads_first: bool, tile):
    block_n, warps, stages = tile
    batch = q.shape[0]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = choose_num_splits(batch, KV_HEADS, MAX_LEN, num_sms, balanced=True)
    mid_o = torch.empty(batch, HEADS, splits, HEAD_DIM, dtype=torch.float32, device="cuda")
    mid_lse = torch.empty(batch, HEADS, splits, dtype=torch.float32, device="cuda")
    arrivals = torch.zeros(batch * KV_HEADS, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    grid = (KV_HEADS, batch, splits) if heads_first else (batch, KV_HEADS, splits)

    def call():
        _decode_any_order[grid](
            q, k_cache, v_cache, tables, seq_lens, out, mid_o, mid_lse, chunk, arrivals,
            HEAD_DIM**-0.5 * LOG2E, splits,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), tables.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            NUM_HEADS=HEADS, GROUP=HEADS // KV_HEADS, BLOCK_G=16, HEAD_DIM=HEAD_DIM, BLOCK_D=HEAD_DIM,
            BLOCK_N=block_n, PAGE=PAGE, HAS_CHUNK=True, HEADS_FIRST=heads_first,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip
        return out
    return call


def reference(q, k_cache, v_cache, tables, lens) -> torch.Tensor:
    """float32 attention of each sequence over its own keys, for checking every variant."""
    outs = []
    for i, n in enumerate(lens):
        blocks = tables[i, : -(-int(n) // PAGE)].long()
        k = k_cache[blocks].reshape(-1, KV_HEADS, HEAD_DIM)[:n].float().repeat_interleave(HEADS // KV_HEADS, 1)
        v = v_cache[blocks].reshape(-1, KV_HEADS, HEAD_DIM)[:n].float().repeat_interleave(HEADS // KV_HEADS, 1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * HEAD_DIM**-0.5
        outs.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(outs)


def one_batch(batch: int, rng: np.random.Generator) -> list[dict]:
    lens = rng.integers(100, 2001, size=batch)
    blocks_per_seq = MAX_LEN // PAGE
    num_blocks = batch * blocks_per_seq
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    chunk = torch.tensor([balanced_chunk(lens, KV_HEADS, num_sms)], dtype=torch.int32, device="cuda")
    read_bytes = 2 * int(lens.sum()) * KV_HEADS * HEAD_DIM * 2
    rows = []
    for layout, shuffled in product(("nhd", "hnd"), (True, False)):
        k_cache, v_cache = make_cache(num_blocks, layout), make_cache(num_blocks, layout)
        order = torch.randperm(num_blocks, device="cuda") if shuffled else torch.arange(num_blocks, device="cuda")
        tables = order.to(torch.int32).view(batch, blocks_per_seq)
        expected = reference(q, k_cache, v_cache, tables, lens)
        for heads_first, tile in product((False, True), TILES):
            call = launcher(q, k_cache, v_cache, tables, seq_lens, chunk, heads_first, tile)
            error = (call().float() - expected).abs().max().item()
            ms = bench_graph(call)
            rows.append({"batch": batch, "layout": layout, "tables": "shuffled" if shuffled else "in order",
                         "order": "head" if heads_first else "seq", "tile": "/".join(map(str, tile)),
                         "us": ms * 1e3, "read_tb_s": read_bytes / (ms * 1e-3) / 1e12, "max_abs_err": error})
        del k_cache, v_cache
    return rows


def main(argv=None) -> None:
    frame, ceiling, out = decode_bandwidth_table(argv, __doc__.splitlines()[0], one_batch, BATCHES, "decode_layout")
    text = f"copy ceiling {ceiling:.2f} TB/s\n{frame.round(4).to_string(index=False)}\n"
    (out / "decode_layout.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
