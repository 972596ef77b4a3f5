"""Gumbel-max sampling of every row of a logits batch in one pass over the vocabulary.

Each row's vocabulary is cut into CHUNK-wide pieces, one program per (row, piece), so that a
batch of a hundred rows still fills the GPU (one program per row left most SMs waiting on a
single 600 KB stream each: 220 us for 256 rows of Qwen3's vocabulary on an H200). A program
streams its piece once (logits of any float dtype, read as float32): masks entries below the
row's cutoff (top-k/top-p, computed beforehand), scales by 1/T, adds Gumbel noise
g = -log(-log(u)) with u a counter-based hash of (the row's 64-bit key, vocabulary index), and
keeps a running argmax; a second kernel picks each row's best piece. The hash is the one
defined in engine/sampler_noise.py (`hash32`), so a row's draw depends only on its key: seeded
requests draw the same token whatever batch they are in. A row with inverse temperature 0 is
greedy: plain argmax of its (masked) logits, no noise. Ties go to the lowest index, as
torch.argmax does.

Under tensor parallelism a rank holds a slice of the vocabulary (its LM head's rows): it scores
its slice with the global indices (vocab_offset), so the noise is the one a single GPU would draw,
and the ranks exchange their per-piece bests instead of the logits (engine.sharded_sampling). The
pieces of all ranks, in rank order, are in vocabulary order, so the same second kernel picks the
token a single GPU would.

NOTE: no integer argument depends on the batch (the keys are [rows, 2], so their row stride is
the constant 2): Triton specialises kernels on integer arguments, and a batch-sized one would
compile new variants in the middle of a run as the batch size changes.

The unfused torch path makes ~6 full-vocabulary float32 passes and builds the noise with ~25
integer ops per element; this reads the logits once. No host syncs; the only allocations are the
output and the per-piece partial results.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
CHUNK = 8 * BLOCK  # vocabulary entries per program: Qwen3's 151,936 make 19 pieces a row
_NO_INDEX = 2**31 - 1  # above every vocabulary index: loses every tie


@triton.jit
def _mix(x):
    # x uint32: two-multiply xorshift finaliser; right shifts of unsigned values are logical
    x ^= x >> 16
    x *= 0x21F0AAAD
    x ^= x >> 15
    x *= 0x735A2D97
    x ^= x >> 15
    return x


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr, stride_row, inv_temp_ptr, words_ptr, cutoff_ptr, best_ptr, best_idx_ptr, vocab, vocab_offset,
    HAS_CUTOFF: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, NUM_CHUNKS: tl.constexpr,
    NO_INDEX: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    inv_t = tl.load(inv_temp_ptr + row)
    k0 = tl.load(words_ptr + 2 * row).to(tl.uint32, bitcast=True)
    k1 = tl.load(words_ptr + 2 * row + 1).to(tl.uint32, bitcast=True)
    greedy = inv_t == 0.0
    base = logits_ptr + row.to(tl.int64) * stride_row
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], dtype=tl.int32) + chunk * CHUNK + vocab_offset
    for offset in range(0, CHUNK, BLOCK):
        column = chunk * CHUNK + offset + tl.arange(0, BLOCK)
        mask = column < vocab
        x = tl.load(base + column, mask=mask, other=float("-inf")).to(tl.float32)
        if HAS_CUTOFF:
            x = tl.where(x < tl.load(cutoff_ptr + row), float("-inf"), x)
        v = column + vocab_offset
        h = _mix(_mix(v.to(tl.uint32) ^ k0) ^ k1)
        u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        gumbel = -tl.log(-tl.log(u))
        score = tl.where(greedy, x, x * inv_t + gumbel)
        # strict >: each lane keeps the first index of its best value
        take = score > best
        best = tl.where(take, score, best)
        best_idx = tl.where(take, v, best_idx)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_idx, NO_INDEX), axis=0)
    tl.store(best_ptr + row * NUM_CHUNKS + chunk, top)
    tl.store(best_idx_ptr + row * NUM_CHUNKS + chunk, first)


@triton.jit
def _best_chunk_kernel(best_ptr, best_idx_ptr, out_ptr, NUM_CHUNKS: tl.constexpr, PADDED: tl.constexpr,
                       NO_INDEX: tl.constexpr):
    row = tl.program_id(0)
    c = tl.arange(0, PADDED)
    mask = c < NUM_CHUNKS
    best = tl.load(best_ptr + row * NUM_CHUNKS + c, mask=mask, other=float("-inf"))
    idx = tl.load(best_idx_ptr + row * NUM_CHUNKS + c, mask=mask, other=NO_INDEX)
    top = tl.max(best, axis=0)
    # pieces are in vocabulary order, so the lowest index among the best is the first overall
    first = tl.min(tl.where(mask & (best == top), idx, NO_INDEX), axis=0)
    tl.store(out_ptr + row, first.to(tl.int64))


def gumbel_argmax(
    logits: torch.Tensor,  # [rows, vocab] float32 or bfloat16/float16 (any row stride, contiguous rows)
    inv_temperature: torch.Tensor,  # [rows] float32; 0 = greedy
    key_words: torch.Tensor,  # [rows, 2] int32: low and high word of each row's 64-bit key
    cutoff: torch.Tensor | None = None,  # [rows] float32: logits below it are excluded
) -> torch.Tensor:  # [rows] int64
    """argmax over v of logits[r, v] * inv_t[r] + gumbel(key[r], v), or plain argmax where inv_t is 0."""
    return best_of_pieces(*gumbel_argmax_pieces(logits, inv_temperature, key_words, cutoff))


def gumbel_argmax_pieces(
    logits: torch.Tensor,  # [rows, columns]: vocabulary entries vocab_offset .. vocab_offset + columns - 1
    inv_temperature: torch.Tensor,  # [rows] float32; 0 = greedy
    key_words: torch.Tensor,  # [rows, 2] int32
    cutoff: torch.Tensor | None = None,  # [rows] float32
    vocab_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:  # [rows, pieces] float32 scores, [rows, pieces] int32 indices
    """Each CHUNK-wide piece's best score and its vocabulary index (the lowest among equals)."""
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.is_floating_point():
        raise ValueError(f"logits must be floating point [rows, vocab] with a contiguous last dim, got "
                         f"{logits.dtype} {tuple(logits.shape)}")
    rows, vocab = logits.shape
    if inv_temperature.shape != (rows,) or inv_temperature.dtype != torch.float32:
        raise ValueError(f"inv_temperature must be float32 [{rows}], got {inv_temperature.dtype} "
                         f"{tuple(inv_temperature.shape)}")
    if key_words.shape != (rows, 2) or key_words.dtype != torch.int32 or not key_words.is_contiguous():
        raise ValueError(f"key_words must be a contiguous int32 [{rows}, 2], got {key_words.dtype} "
                         f"{tuple(key_words.shape)}")
    if cutoff is not None and (cutoff.shape != (rows,) or cutoff.dtype != torch.float32):
        raise ValueError(f"cutoff must be float32 [{rows}], got {cutoff.dtype} {tuple(cutoff.shape)}")
    if not (0 <= vocab_offset and vocab_offset + vocab < _NO_INDEX):
        raise ValueError(f"vocab_offset must be >= 0 with offset + columns < 2**31 - 1, got {vocab_offset}")
    num_chunks = triton.cdiv(vocab, CHUNK)
    best = torch.empty((rows, num_chunks), dtype=torch.float32, device=logits.device)
    best_idx = torch.empty((rows, num_chunks), dtype=torch.int32, device=logits.device)
    if rows and num_chunks:
        _gumbel_argmax_kernel[(rows, num_chunks)](
            logits, logits.stride(0), inv_temperature, key_words,
            cutoff if cutoff is not None else inv_temperature, best, best_idx, vocab, vocab_offset,
            HAS_CUTOFF=cutoff is not None, BLOCK=BLOCK, CHUNK=CHUNK, NUM_CHUNKS=num_chunks, NO_INDEX=_NO_INDEX,
            num_warps=4,
        )
    return best, best_idx


def best_of_pieces(best: torch.Tensor, best_idx: torch.Tensor) -> torch.Tensor:  # [rows] int64
    """best [rows, pieces] float32 and best_idx [rows, pieces] int32, pieces in vocabulary order ->
    each row's token: the best score, the lowest index among equals."""
    rows, num_chunks = best.shape
    if best_idx.shape != best.shape or not (best.is_contiguous() and best_idx.is_contiguous()):
        raise ValueError(f"best and best_idx must be contiguous and of one shape, got {tuple(best.shape)} "
                         f"and {tuple(best_idx.shape)}")
    out = torch.empty(rows, dtype=torch.int64, device=best.device)
    if rows:
        _best_chunk_kernel[(rows,)](best, best_idx, out, NUM_CHUNKS=num_chunks,
                                    PADDED=triton.next_power_of_2(num_chunks), NO_INDEX=_NO_INDEX, num_warps=1)
    return out
