"""xxHash64 of 8-byte inputs over numpy arrays: the values xxhash.xxh64_intdigest gives for
(int).to_bytes(8, "little") under a 64-bit seed, many at once (tests/sim/test_xxh.py checks them
against the xxhash package). The simulator samples a fast-forwarded run's tokens with it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5_PLUS_8 = np.uint64((0x27D4EB2F165667C5 + 8) & 0xFFFFFFFFFFFFFFFF)  # PRIME64_5 plus the input's length

U64 = npt.NDArray[np.uint64]


def xxh64_u64(values: U64, seed: int | U64) -> U64:
    """xxh64 of each value's 8 little-endian bytes under seed (one, or one per value): wrapping
    uint64 arithmetic, the short-input path of XXH64 (one 8-byte lane, then the avalanche), in
    place on one array (a temporary per operation would cost as much as the operations)."""
    return xxh64_from_lanes(xxh64_lanes(values), seed)


def xxh64_lanes(values: U64) -> U64:
    """The part of xxh64_u64 that does not depend on the seed (the lane's round): a table of it
    over positions makes each later hash of a position five operations shorter."""
    h: U64 = values * _P2
    _rotl_in_place(h, 31)
    h *= _P1
    return h


def xxh64_from_lanes(lanes: U64, seed: int | U64) -> U64:
    """xxh64_u64 of the values whose xxh64_lanes are lanes (overwritten: the result is lanes)."""
    h = lanes
    if isinstance(seed, int):
        h ^= np.uint64((seed + int(_P5_PLUS_8)) & 0xFFFFFFFFFFFFFFFF)
    else:
        h ^= seed + _P5_PLUS_8
    _rotl_in_place(h, 27)
    h *= _P1
    h += _P4
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


def _rotl_in_place(x: U64, r: int) -> None:
    high = x >> np.uint64(64 - r)
    x <<= np.uint64(r)
    x |= high


def xxh64_range(first: int, count: int, seed: int) -> U64:
    """xxh64_u64 of first, first + 1, ..., first + count - 1."""
    return xxh64_u64(np.arange(first, first + count, dtype=np.uint64), seed)
