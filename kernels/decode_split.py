"""How the decode kernel (kernels.decode_attention) spreads a batch's keys over its programs.
Host side only: plain integers and numpy, so CPU tests can check the rules.

A program is one (sequence, KV head, split). The launch has a fixed split count S (a CUDA graph
fixes it at capture), and a sequence of length L uses only the first ceil(L / chunk) of its S
programs, each walking at most `chunk` keys. Two rules set the chunk:
- even: chunk = L / S, rounded up to whole tiles. Every sequence is cut into the same number
  of pieces, so in a ragged batch the longest sequence's programs are the longest: with one
  split (batch >= 33 on an H100 with 8 KV heads) a tenth of the batch at 3,700 keys and the
  rest at 700 made the kernel 66-75% slower than an even batch of the same total
  (experiments/kernels/decode_balance.py, H100).
- balanced: the step also passes the batch's fair share of keys per program (balanced_chunk),
  and chunk = max(fair share, L / S). Long sequences are cut into pieces of about the fair
  share, short ones stay whole, and the step's time follows its total context, which is what the
  simulator's cost model prices, as far as the programs are many enough to keep the memory busy;
  where they are not, sim.decode_programs prices the longest ones (docs/decode-programs.md).
The integer rules live in engine.core.decode_split, which the simulator shares.
"""

from __future__ import annotations

import numpy as np

from engine.core.decode_split import (
    BALANCE_CHUNK,
    MAX_BALANCE_PROGRAMS,
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    choose_num_splits,
    fair_share,
)

__all__ = ["BALANCE_CHUNK", "MAX_BALANCE_PROGRAMS", "MAX_SPLITS", "MIN_TOKENS_PER_SPLIT", "balanced_chunk",
           "choose_num_splits", "split_chunks"]


def _cdiv(a, b):  # numpy arrays
    return -(-a // b)


def balanced_chunk(seq_lens: np.ndarray, num_kv_heads: int, num_sms: int, block_n: int = 64) -> int:
    """The fair share of the batch's keys per program, in whole block_n tiles: the mean context
    when the batch has at least two programs per SM at one split each, else the keys spread over
    four programs per SM (the even rule's target). Rows of length 0 are padding."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    real = lens[lens > 0]
    return fair_share(int(real.size), int(real.sum()), num_kv_heads, num_sms, block_n)


def split_chunks(seq_lens: np.ndarray, num_splits: int, chunk: int | None, block_n: int = 64) -> np.ndarray:
    """Keys per program of each sequence, as the kernel derives them (chunk None: the even rule).
    Sequence i uses ceil(seq_lens[i] / result[i]) programs, at least one."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    even = np.maximum(block_n, _cdiv(_cdiv(lens, num_splits), block_n) * block_n)
    return even if chunk is None else np.maximum(even, chunk)
