"""How the engine's split-KV decode kernel (kernels.decode_attention) spreads a decode step's keys
over its programs: the one rule of both backends. The engine passes the fair share to the kernel
(kernels.decode_split, engine.batch); the simulator prices the programs it yields
(sim.decode_programs). Plain ints: kernels.decode_split says why the rule is what it is.

A program is one (sequence, KV head, split). A launch has a fixed split count S, and a sequence
of length L uses ceil(L / chunk) of its S programs, chunk = max(fair share, L / S in whole tiles).
"""

from __future__ import annotations

# One 64-token tile per split is still a win at batch 1 on H100 (experiments/kernels/NOTES.md).
MIN_TOKENS_PER_SPLIT = 64
MAX_SPLITS = 64
# With balanced chunks a launch keeps room for sequences this long to be cut into pieces of this
# many keys; the unused programs return at once, but not for free: about 0.5 us per thousand
# (H100, a batch of 512 with 40 splits, max_model_len 40,960: +80 us per layer). So the room stops
# at MAX_BALANCE_PROGRAMS programs in all, which a batch of 512 with 8 KV heads reaches at 4 splits.
BALANCE_CHUNK = 1024
MAX_BALANCE_PROGRAMS = 16384
BLOCK_N = 64  # keys per tile: a program walks whole tiles


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                      balanced: bool = False) -> int:
    """Enough splits for about four programs per SM, none shorter than MIN_TOKENS_PER_SPLIT;
    balanced: also enough for max_seq_len to be cut into BALANCE_CHUNK pieces, as far as
    MAX_BALANCE_PROGRAMS allows."""
    programs = max(1, num_seqs * num_kv_heads)
    wanted = 1 if programs >= 2 * num_sms else cdiv(4 * num_sms, programs)
    if balanced:
        room = max(1, MAX_BALANCE_PROGRAMS // programs)
        wanted = max(wanted, min(cdiv(max_seq_len, BALANCE_CHUNK), room))
    useful = max(1, cdiv(max_seq_len, MIN_TOKENS_PER_SPLIT))
    return max(1, min(wanted, useful, MAX_SPLITS))


def mean_share(num_seqs: int, num_kv_heads: int, num_sms: int) -> bool:
    """Whether the batch's fair share is its mean context: at least two programs per SM at one
    split each (num_seqs: the real sequences)."""
    return num_seqs * num_kv_heads >= 2 * num_sms


def fair_share(num_seqs: int, total_keys: int, num_kv_heads: int, num_sms: int, block_n: int = BLOCK_N) -> int:
    """The batch's fair share of keys per program, in whole tiles: its mean context once the batch
    has at least two programs per SM at one split each, else its keys spread over four programs per
    SM (num_seqs, total_keys: the real sequences', padding left out)."""
    if num_seqs <= 0:
        return block_n
    programs = num_seqs * num_kv_heads
    slots = programs if mean_share(num_seqs, num_kv_heads, num_sms) else 4 * num_sms
    fair = cdiv(total_keys * num_kv_heads, slots)
    return max(block_n, cdiv(fair, block_n) * block_n)

