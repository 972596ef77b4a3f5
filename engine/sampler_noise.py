"""Counter-based noise for Gumbel-max sampling: the noise of vocabulary entry v in a row is a hash
of (the row's 64-bit key, v), so any set of rows is drawn in one batched pass and a row's draw
depends on its key alone, never on the batch around it.

Key of a seeded request's draw: seed_for(seed, index of the token being sampled) (splitmix64).
Hash: h = mix(mix(v ^ k0) ^ k1) over uint32, with (k0, k1) the key's low and high words and mix
the two-multiply xorshift finaliser below (both multipliers < 2**31). The top 24 bits give a
uniform u = (h >> 8 + 0.5) / 2**24 in (0, 1); E = -log(u) is Exp(1) and argmax(s - log E) is a
draw from softmax(s). kernels/sampling.py computes the same hash on the GPU; `hash32` is the
scalar definition both are tested against.

Torch has no usable uint32 arithmetic, so the tensor version runs on int32 words: multiplication
wraps modulo 2**32 exactly as uint32 does (two's complement), and right shifts are masked to
behave as logical shifts.
"""

from __future__ import annotations

import numpy as np
import torch

MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
MIX_MUL1 = 0x21F0AAAD
MIX_MUL2 = 0x735A2D97
UNIFORM_BITS = 24

_SPLITMIX = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def seed_for(seed: int, index: int) -> int:
    """A well-mixed 63-bit key for draw `index` of a request seeded with `seed` (splitmix64
    finaliser: nearby (seed, index) pairs give unrelated keys)."""
    a, b, c = _SPLITMIX
    z = (seed * a + (index + 1) * b) & _MASK64
    z = ((z ^ (z >> 30)) * b) & _MASK64
    z = ((z ^ (z >> 27)) * c) & _MASK64
    return (z ^ (z >> 31)) >> 1


def keys_for(seeds: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """seed_for over arrays: seeds [n] uint64, indices [n] int -> [n] uint64 (wrapping arithmetic)."""
    a, b, c = (np.uint64(x) for x in _SPLITMIX)
    z = seeds.astype(np.uint64) * a + (indices.astype(np.uint64) + np.uint64(1)) * b
    z = (z ^ (z >> np.uint64(30))) * b
    z = (z ^ (z >> np.uint64(27))) * c
    return (z ^ (z >> np.uint64(31))) >> np.uint64(1)


def key_words(keys: np.ndarray) -> np.ndarray:
    """[n] uint64 keys -> [n, 2] int32: (low word, high word) per key, bit for bit."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    # little-endian uint64 -> its two uint32 halves, low first
    return keys.astype("<u8").view("<u4").reshape(-1, 2).view(np.int32)


def _mix(x: int) -> int:
    x ^= x >> 16
    x = (x * MIX_MUL1) & MASK32
    x ^= x >> 15
    x = (x * MIX_MUL2) & MASK32
    return x ^ (x >> 15)


def hash32(v: int, key: int) -> int:
    """The noise hash of vocabulary entry v under a 64-bit key, as a uint32 (scalar definition)."""
    return _mix(_mix(v ^ (key & MASK32)) ^ ((key >> 32) & MASK32))


def _mix_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    # x int32 holding uint32 bits; (x >> s) & mask is the logical shift of those bits
    for shift, mul in ((16, MIX_MUL1), (15, MIX_MUL2), (15, None)):
        torch.bitwise_right_shift(x, shift, out=tmp)
        tmp &= (1 << (32 - shift)) - 1
        x ^= tmp
        if mul is not None:
            x *= mul


def hash_bits(words: torch.Tensor, vocab: int, first: int = 0) -> torch.Tensor:
    """words [rows, 2] int32 -> [rows, vocab] int32 holding hash32(v, key_row)'s bits for
    v = first .. first + vocab - 1 (a tensor-parallel rank's slice of the vocabulary)."""
    v = torch.arange(first, first + vocab, dtype=torch.int32, device=words.device)
    x = v[None, :] ^ words[:, :1]  # [rows, vocab]
    tmp = torch.empty_like(x)
    _mix_(x, tmp)
    x ^= words[:, 1:]
    _mix_(x, tmp)
    return x


def log_exponential(words: torch.Tensor, vocab: int, first: int = 0) -> torch.Tensor:
    """words [rows, 2] int32 -> log E [rows, vocab] float32 with E = -log(u) ~ Exp(1), for
    vocabulary entries first .. first + vocab - 1."""
    bits = hash_bits(words, vocab, first)
    torch.bitwise_right_shift(bits, 32 - UNIFORM_BITS, out=bits)
    bits &= (1 << UNIFORM_BITS) - 1
    u = bits.float().add_(0.5).mul_(2.0**-UNIFORM_BITS)
    return u.log_().neg_().log_()
