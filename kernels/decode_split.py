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
  simulator's cost model prices.
"""

from __future__ import annotations

import numpy as np

# One 64-token tile per split is still a win at batch 1 on H100 (experiments/kernels/NOTES.md).
MIN_TOKENS_PER_SPLIT = 64
MAX_SPLITS = 64
# With balanced chunks a launch keeps room for sequences this long to be cut into pieces of this
# many keys; the unused programs return at once, but not for free: about 0.5 us per thousand
# (H100, a batch of 512 with 40 splits, max_model_len 40,960: +80 us per layer). So the room stops
# at MAX_BALANCE_PROGRAMS programs in all, which a batch of 512 with 8 KV heads reaches at 4 splits.
BALANCE_CHUNK = 1024
MAX_BALANCE_PROGRAMS = 16384


def _cdiv(a, b):  # ints or numpy arrays
    return -(-a // b)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                      balanced: bool = False) -> int:
    """Enough splits for about four programs per SM, none shorter than MIN_TOKENS_PER_SPLIT;
    balanced: also enough for max_seq_len to be cut into BALANCE_CHUNK pieces, as far as
    MAX_BALANCE_PROGRAMS allows."""
    programs = max(1, num_seqs * num_kv_heads)
    wanted = 1 if programs >= 2 * num_sms else _cdiv(4 * num_sms, programs)
    if balanced:
        room = max(1, MAX_BALANCE_PROGRAMS // programs)
        wanted = max(wanted, min(_cdiv(max_seq_len, BALANCE_CHUNK), room))
    useful = max(1, _cdiv(max_seq_len, MIN_TOKENS_PER_SPLIT))
    return max(1, min(wanted, useful, MAX_SPLITS))


def balanced_chunk(seq_lens: np.ndarray, num_kv_heads: int, num_sms: int, block_n: int = 64) -> int:
    """The fair share of the batch's keys per program, in whole block_n tiles: the mean context
    when the batch has at least two programs per SM at one split each, else the keys spread over
    four programs per SM (the even rule's target). Rows of length 0 are padding."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    real = lens[lens > 0]
    if real.size == 0:
        return block_n
    programs = int(real.size) * num_kv_heads
    slots = programs if programs >= 2 * num_sms else 4 * num_sms
    fair = _cdiv(int(real.sum()) * num_kv_heads, slots)
    return max(block_n, _cdiv(fair, block_n) * block_n)


def split_chunks(seq_lens: np.ndarray, num_splits: int, chunk: int | None, block_n: int = 64) -> np.ndarray:
    """Keys per program of each sequence, as the kernel derives them (chunk None: the even rule).
    Sequence i uses ceil(seq_lens[i] / result[i]) programs, at least one."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    even = np.maximum(block_n, _cdiv(_cdiv(lens, num_splits), block_n) * block_n)
    return even if chunk is None else np.maximum(even, chunk)
