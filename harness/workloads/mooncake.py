"""Mooncake traces: prompt token ids from `hash_ids`, and any workload written out as Mooncake JSONL.

A Mooncake request names its prompt's blocks by id (`hash_ids`); equal ids mean equal tokens, so a
prefix cache can reuse them. A block is 512 tokens in Mooncake's own traces; other tools write
Mooncake-format traces hashed at other sizes (aiperf, guidellm, Dynamo: 16, 64, 128), so the size is
a parameter (workload.hash_block_tokens). Token ids here are a pure function of (seed, hash id,
position in the block), so requests sharing a hash id share those tokens exactly, whatever block
size the cache uses, and requests whose ids differ get different blocks (up to 64-bit hash
collisions). A prompt shorter than its blocks ends inside its last block and takes that block's
leading tokens; a prompt longer than its blocks continues with blocks of its own, shared with no
other request. Clipping cuts prompts from the end, so the shared leading blocks survive.

Writing is the inverse: a prompt's blocks (its last possibly partial) get ids by chained
hashing, each block's hash covering every token before it, so equal prefixes get equal ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from engine.core import Request

log = logging.getLogger(__name__)

BLOCK_TOKENS = 512  # Mooncake's own block: the prefix granule its hash ids name (the default size)
_OWN_BLOCK = np.uint64(0x5EED0F0B10C5EED5)  # marks blocks beyond a request's hash ids (its own)
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic): a bijection that
    scrambles every input bit into every output bit."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_seed(seq: np.random.SeedSequence) -> np.uint64:
    """The 64-bit key every block's tokens are derived under (one per workload seed)."""
    return np.uint64(int(seq.generate_state(1, dtype=np.uint64)[0]) & int(_MASK))


def prompt_token_ids(hash_ids: Sequence[Sequence[int]], prompt: np.ndarray, rows: Sequence[int],
                     seed: np.uint64, bound: int, block_tokens: int = BLOCK_TOKENS) -> np.ndarray:
    """Every prompt's token ids, concatenated (int64, in [0, bound)): prompt i is prompt[i] tokens
    (0 for none) of the block_tokens-token blocks hash_ids[i], then, past them, blocks of its own
    keyed by its trace row rows[i]."""
    keys: list[int] = []
    own: list[bool] = []
    for ids, length, row in zip(hash_ids, prompt.tolist(), rows):
        needed = -(-length // block_tokens)
        missing = max(needed - len(ids), 0)
        keys += list(ids[:needed]) + [(row << 20) + j for j in range(missing)]
        own += [False] * min(needed, len(ids)) + [True] * missing
    blocks = (prompt + block_tokens - 1) // block_tokens
    block_len = np.full(len(keys), block_tokens, dtype=np.int64)
    some = blocks > 0  # a prompt of 0 tokens (a request left out) has no block
    block_len[np.cumsum(blocks)[some] - 1] = (prompt - (blocks - 1) * block_tokens)[some]  # last blocks may be partial
    # own blocks are keyed apart from the file's ids, so that a row's key never meets a hash id
    base = _mix(_mix(np.asarray(keys, dtype=np.uint64)) ^ seed ^ np.where(own, _OWN_BLOCK, np.uint64(0)))
    starts = np.cumsum(block_len) - block_len
    offset = np.arange(int(block_len.sum()), dtype=np.uint64) - np.repeat(starts, block_len).astype(np.uint64)
    tokens = _mix(np.repeat(base, block_len) + offset) % np.uint64(bound)
    return tokens.astype(np.int64)


def warn_uncovered(hash_ids: Sequence[Sequence[int]], prompt: np.ndarray, recorded: np.ndarray,
                   block_tokens: int = BLOCK_TOKENS) -> None:
    """Log how many prompts (as served: prompt) run past the blocks their hash_ids name
    (prompt_token_ids gives those tokens blocks of their own), and how many name more blocks than
    their length in the file (recorded) fills (the extra ids name no token). Both are what a trace
    hashed at another block size than block_tokens shows, so both name the setting."""
    extra = sum(-(-length // block_tokens) > len(ids) for ids, length in zip(hash_ids, prompt.tolist()))
    if extra:
        log.warning("mooncake trace: %d prompts are longer than their hash_ids cover (%d tokens a block: "
                    "workload.hash_block_tokens); their last tokens are their own, shared with no other request",
                    extra, block_tokens)
    unused = sum(-(-length // block_tokens) < len(ids) for ids, length in zip(hash_ids, recorded.tolist()))
    if unused:
        log.warning("mooncake trace: %d prompts have more hash_ids than their %d-token blocks; the ids past "
                    "their last block are not used (workload.hash_block_tokens=%d tokens a hash id; a trace "
                    "hashed at another size needs that size there)", unused, block_tokens, block_tokens)


def chained_block_hashes(token_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[bytes]:
    """One digest per block of token_ids (the last possibly partial), each covering every token
    up to its block's end: equal digests at block k mean equal first k+1 blocks."""
    digests: list[bytes] = []
    previous = b""
    tokens = np.asarray(token_ids, dtype=np.int64)
    for start in range(0, len(tokens), block_tokens):
        previous = hashlib.blake2b(previous + tokens[start : start + block_tokens].tobytes(), digest_size=16).digest()
        digests.append(previous)
    return digests


def mooncake_records(requests: Iterable[Request], block_tokens: int = BLOCK_TOKENS) -> list[dict]:
    """Mooncake rows for requests, in their order: arrival in whole milliseconds, prompt and output
    lengths, and the ids of block_tokens-token blocks numbered from 0 in order of first appearance."""
    numbering: dict[bytes, int] = {}
    records = []
    for request in requests:
        prompt = request.token_ids[: request.num_prompt_tokens]
        ids = [numbering.setdefault(d, len(numbering)) for d in chained_block_hashes(prompt, block_tokens)]
        records.append({"timestamp": round(request.arrival_time * 1000), "input_length": request.num_prompt_tokens,
                        "output_length": request.sampling_params.max_tokens, "hash_ids": ids})
    return records


def write_mooncake(requests: Iterable[Request], path: Path | str, block_tokens: int = BLOCK_TOKENS) -> Path:
    """Write requests as Mooncake JSONL (one object a line, hash ids of block_tokens-token blocks)
    for other tools to replay; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for record in mooncake_records(requests, block_tokens):
            out.write(json.dumps(record) + "\n")
    return path
