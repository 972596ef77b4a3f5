"""Random paged-KV batches for the kernel tests.

Every cache slot outside a sequence's context holds NaN, so a kernel that reads past seq_len, into
the tail of a partly filled block, or into a block it does not own turns its output into NaN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def fresh_seed() -> int:
    """A new seed per test (never a fixed one); tests print it so a failure can be replayed."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


@dataclass(frozen=True)
class PagedBatch:
    q: torch.Tensor  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor  # [num_tokens, num_kv_heads, head_dim], this step's keys
    v: torch.Tensor  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [num_tokens] int64
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    max_query_len: int
    max_seq_len: int


def make_paged_batch(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    device: str = "cuda",
    store_new: bool = True,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Sequences whose last q_lens[i] positions are this step's tokens.

    Physical blocks are a random permutation (plus spare, never-used blocks). The context before
    this step is random; the new tokens' slots hold k/v already when store_new, else NaN (for
    tests that run the store themselves).
    """
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max([1, *blocks_per_seq])
    block_tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    slot_mapping = torch.empty(num_tokens, dtype=torch.int64)
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # [num_slots, num_kv_heads, head_dim]
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    tok = 0
    for i, (seq_len, q_len) in enumerate(zip(seq_lens, q_lens)):
        assert 0 <= q_len <= seq_len
        blocks = torch.tensor([perm.pop() for _ in range(blocks_per_seq[i])], dtype=torch.int64)
        block_tables[i, : len(blocks)] = blocks.to(torch.int32)
        pos = torch.arange(seq_len)
        slots = blocks[pos // block_size] * block_size + pos % block_size  # [seq_len]
        old, new = slots[: seq_len - q_len], slots[seq_len - q_len :]
        k_flat[old] = torch.randn(len(old), num_kv_heads, head_dim, generator=gen).to(dtype)
        v_flat[old] = torch.randn(len(old), num_kv_heads, head_dim, generator=gen).to(dtype)
        slot_mapping[tok : tok + q_len] = new
        if store_new:
            k_flat[new] = k[tok : tok + q_len]
            v_flat[new] = v[tok : tok + q_len]
        tok += q_len
    query_start_loc = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    return PagedBatch(
        q=q.to(device),
        k=k.to(device),
        v=v.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        slot_mapping=slot_mapping.to(device),
        query_start_loc=query_start_loc.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=max(q_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; inf if out has a NaN."""
    out64, ref64 = out.double(), ref.double()
    if torch.isnan(out64).any():
        return float("inf")
    return (torch.linalg.vector_norm(out64 - ref64) / torch.linalg.vector_norm(ref64)).item()


def assert_close_per_seq(out, ref, query_start_loc, seed, tol=1e-2) -> None:
    """Relative error under tol for every sequence separately (a short sequence's error would
    vanish in the norm of a long one's)."""
    starts = query_start_loc.tolist()
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        err = rel_err(out[lo:hi], ref[lo:hi])
        assert err < tol, f"seq {i} (rows {lo}:{hi}) rel err {err:.3e} >= {tol} (seed {seed})"
