"""The simulator's sampled tokens: a token is a hash of (seed, request id, position) modulo the
vocabulary, never the end-of-sequence token (sim.executor). It depends on nothing a deployment
changes (hardware, TP size, scheduler knobs, router), so a plan that serves one workload on many
deployments computes each request's tokens once (SampledTokens) and every executor reads them.

Many tokens at once are hashed in one numpy pass (sim.xxh), a few one by one (numpy's fixed cost
per call is that of about a hundred tokens hashed in Python); both give xxhash's values.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import xxhash

from engine.core.request import TokenIds
from sim.xxh import xxh64_from_lanes, xxh64_lanes

# position.to_bytes(8, "little") (positions are never negative), in half the time: once per sampled token
position_bytes = struct.Struct("<Q").pack
VECTOR_TOKENS = 128  # hash_runs hashes this many tokens and more in one numpy pass


def request_seed(request_id: str, seed: int) -> int:
    """The hash seed of a request's tokens under an executor's seed."""
    return xxhash.xxh64_intdigest(request_id.encode(), seed)


def hash_tokens(request_seed_: int, first: int, count: int, vocab_size: int, eos_token_id: int | None) -> list[int]:
    """The tokens at positions first .. first + count - 1 of the request with this hash seed, one by one."""
    hash_int = xxhash.xxh64_intdigest
    tokens = [hash_int(position_bytes(p), request_seed_) % vocab_size for p in range(first, first + count)]
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = [(t + 1) % vocab_size if t == eos_token_id else t for t in tokens]
    return tokens


class PositionLanes:
    """xxh64_lanes of positions 0, 1, ...: the part of a position's hash that does not depend on
    the seed, kept because every run of a simulation hashes the same positions again."""

    def __init__(self) -> None:
        self._lanes: npt.NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)

    def upto(self, end: int) -> npt.NDArray[np.uint64]:
        """The table, covering positions below end at least (grown by doubling)."""
        if len(self._lanes) < end:
            self._lanes = xxh64_lanes(np.arange(max(end, 2 * len(self._lanes)), dtype=np.uint64))
        return self._lanes


def hash_runs(runs: Sequence[tuple[int, int, int]], vocab_size: int, eos_token_id: int | None,
              lanes: PositionLanes | None = None) -> list[list[int]]:
    """hash_tokens for each (request seed, first position, count), the same values, in one numpy
    pass (a few tokens in all one by one); lanes: a table kept across calls (else made here)."""
    if sum(count for _, _, count in runs) < VECTOR_TOKENS:
        return [hash_tokens(s, first, count, vocab_size, eos_token_id) for s, first, count in runs]
    tokens, offsets = _hashed(runs, vocab_size, eos_token_id, lanes)
    flat = tokens.tolist()
    return [flat] if len(runs) == 1 else [flat[o : o + c] for o, c in zip(offsets, _counts(runs))]


def hash_runs_packed(runs: Sequence[tuple[int, int, int]], vocab_size: int, eos_token_id: int | None,
                     lanes: PositionLanes | None = None) -> list[TokenIds]:
    """hash_runs, the tokens of one numpy pass as arrays ("q") of their bytes: no int object per
    token (packed ids, engine.core.request.TokenIds); a few tokens in all as hash_runs has them."""
    if sum(count for _, _, count in runs) < VECTOR_TOKENS:
        return [hash_tokens(s, first, count, vocab_size, eos_token_id) for s, first, count in runs]
    tokens, offsets = _hashed(runs, vocab_size, eos_token_id, lanes)
    flat = array("q", tokens.tobytes())
    return [flat] if len(runs) == 1 else [flat[o : o + c] for o, c in zip(offsets, _counts(runs))]


def _counts(runs: Sequence[tuple[int, int, int]]) -> list[int]:
    return [count for _, _, count in runs]


def _hashed(runs: Sequence[tuple[int, int, int]], vocab_size: int, eos_token_id: int | None,
            lanes: PositionLanes | None) -> tuple[npt.NDArray[np.int64], list[int]]:
    """The runs' tokens, one after the other, and where each run starts among them."""
    counts = _counts(runs)
    total = sum(counts)
    table = (lanes or PositionLanes()).upto(max(first + count for _, first, count in runs))
    if len(runs) == 1:
        seed, first, _ = runs[0]
        hashes = xxh64_from_lanes(table[first : first + total].copy(), seed)
        offsets = [0]
    else:
        count_a = np.array(counts, dtype=np.int64)
        firsts = np.array([first for _, first, _ in runs], dtype=np.int64)
        starts = np.cumsum(count_a) - count_a
        positions = np.arange(total, dtype=np.int64) + np.repeat(firsts - starts, count_a)
        seeds = np.repeat(np.array([s for s, _, _ in runs], dtype=np.uint64), count_a)
        hashes = xxh64_from_lanes(table.take(positions), seeds)
        offsets = starts.tolist()
    hashes %= np.uint64(vocab_size)
    tokens = hashes.astype(np.int64)  # (Python ints of an int64 array are made faster than of uint64)
    if eos_token_id is not None:
        tokens[tokens == eos_token_id] = (eos_token_id + 1) % vocab_size
    return tokens, offsets


@dataclass(frozen=True)
class SampledTokens:
    """Tokens computed ahead for some requests and positions, under one seed, vocabulary and
    end-of-sequence token: tokens[request id] = (first position, the tokens from there on). An
    executor of that seed, vocabulary and eos reads them where they cover what it samples and
    hashes the rest."""

    seed: int
    vocab_size: int
    eos_token_id: int | None
    tokens: Mapping[str, tuple[int, list[int]]]

    @classmethod
    def ahead(cls, runs: Sequence[tuple[str, int, int]], seed: int, vocab_size: int,
              eos_token_id: int | None) -> SampledTokens:
        """The tokens of each (request id, first position, count), hashed in one pass."""
        seeded = [(request_seed(request_id, seed), first, count) for request_id, first, count in runs]
        tokens = hash_runs(seeded, vocab_size, eos_token_id) if runs else []
        return cls(seed, vocab_size, eos_token_id,
                   {request_id: (first, run) for (request_id, first, _), run in zip(runs, tokens)})

    def suits(self, seed: int, vocab_size: int, eos_token_id: int | None) -> bool:
        """Whether these are the tokens an executor of this seed, vocabulary and eos samples."""
        return (self.seed, self.vocab_size, self.eos_token_id) == (seed, vocab_size, eos_token_id)
