"""Paged KV-cache block pool with chained-hash prefix caching.

NOTE on the prefix cache:
- A block is offered to the cache only once it is full and its KV has been computed. Its key is
  xxh64(previous block's key || token ids), so a key names the whole prefix up to that block.
- A hit is confirmed by comparing the stored token ids, so a hash collision costs a miss, never
  wrong KV.
- Freed blocks keep their key (lazy eviction): a later request with the same prefix takes them
  back from the free pool. A key is dropped only when its block is handed out for new content.
- Eviction order is LRU over freed blocks: free blocks sit in an ordered pool, the least
  recently freed at the front, and fresh allocations take from the front. A request's blocks
  are freed tail first, so the blocks of a shared prefix (its head) are the last to go.
- At least the last token of a prompt is always computed (its logits give the first output
  token), so a lookup never returns the block holding the last token.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeAlias

import xxhash

from engine.core.request import Request, TokenIds

_NO_PARENT = 0
Ids: TypeAlias = "list[int] | tuple[int, ...] | array[int]"  # a block's token ids


def chain_hash(parent: int, token_ids: Ids) -> int:
    return block_hasher(len(token_ids))(parent, token_ids)


def block_hasher(size: int) -> Callable[[int, Ids], int]:
    """chain_hash for blocks of `size` tokens, the packing compiled once (it runs per full block)."""
    # struct packs the ids to the bytes array("q", token_ids) holds, in half the time; an
    # array("q") (packed ids, engine.core.request.TokenIds) has them
    pack = struct.Struct(f"{size}q").pack

    def hash_block(parent: int, token_ids: Ids) -> int:
        data = token_ids.tobytes() if isinstance(token_ids, array) else pack(*token_ids)
        return xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + data)

    return hash_block


def block_keys(data: bytes | memoryview, block_size: int) -> list[int]:
    """The keys of the full blocks of token ids given as native int64 bytes (numpy's tobytes):
    chain_hash's, block after block, without packing the ids (a caller that has the bytes sets a
    request's block_hashes from them before the block manager sees it)."""
    width = 8 * block_size
    digest = xxhash.xxh64_intdigest
    view = memoryview(data).cast("B")
    keys: list[int] = []
    parent = _NO_PARENT
    for start in range(0, len(view) - width + 1, width):
        parent = digest(parent.to_bytes(8, "little") + view[start : start + width])
        keys.append(parent)
    return keys


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_keys: list[int | None] = [None] * num_blocks
        self.block_parent_keys: list[int | None] = [None] * num_blocks
        # a cached block's token ids (a slice of its request's, kept as the list: never changed)
        self.block_tokens: list[TokenIds | None] = [None] * num_blocks
        self.key_to_block: dict[int, int] = {}
        self.free_pool: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Held blocks' references beyond their first (sum of max(holders - 1, 0)) and the requests
        # holding any block: what engine.core.kv_reads counts a step's repeated reads from.
        self.num_extra_refs = 0
        self.num_holders = 0
        self.hits = 0  # blocks served from the cache
        self.misses = 0  # full prompt blocks looked up and not found
        self.evictions = 0  # cached blocks whose key was dropped to hold new content
        self.num_taken = 0  # blocks ever taken from the pool: a freed block unchanged while it stands
        self._hash_block = block_hasher(block_size)

    # ---- queries -------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_pool)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_pool)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def lookup(self, request: Request) -> list[int]:
        """Blocks holding the longest cached prefix of the request's tokens (no side effects)."""
        if not self.enable_prefix_caching:
            return []
        size = self.block_size
        tokens = request.token_ids
        max_blocks = (len(tokens) - 1) // size  # the last token is always computed
        self._extend_hashes(request, max_blocks)
        hits: list[int] = []
        for i in range(max_blocks):
            block = self.key_to_block.get(request.block_hashes[i])
            if block is None or self.block_tokens[block] != tokens[i * size : (i + 1) * size]:
                break
            hits.append(block)
        return hits

    def prefix_key(self, request: Request) -> int | None:
        """The chained hash of the request's first block of prompt tokens (its block_hashes[0], computed
        here if not yet), a function of those tokens alone; None where the prompt fills no block."""
        if request.num_prompt_tokens < self.block_size:
            return None
        if request.block_hashes:
            return request.block_hashes[0]
        return self._hash_block(_NO_PARENT, request.token_ids[: self.block_size])

    def num_blocks_to_allocate(self, request: Request, num_tokens: int, hits: Sequence[int] = ()) -> int:
        """Free blocks consumed if the request's table grows to cover num_tokens (hits first)."""
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)
        fresh = self.blocks_for(num_tokens) - len(request.block_table) - len(hits)
        return revived + max(fresh, 0)

    def can_allocate(self, request: Request, num_tokens: int, hits: Sequence[int] = ()) -> bool:
        return self.num_blocks_to_allocate(request, num_tokens, hits) <= len(self.free_pool)

    # ---- mutations -----------------------------------------------------------------------

    def allocate(self, request: Request, num_tokens: int, hits: Sequence[int] = ()) -> None:
        """Grow the request's table to cover num_tokens, starting with the cache hits.

        The caller checks can_allocate first; running out here is a scheduler bug.
        """
        table = request.block_table
        was_empty = not table
        if hits:
            assert not table, "cache hits are taken only by a request with no blocks"
            for block in hits:
                if self.ref_counts[block] == 0:
                    del self.free_pool[block]
                else:
                    self.num_extra_refs += 1
                self.ref_counts[block] += 1
                table.append(block)
            self.hits += len(hits)
            request.num_registered_blocks = len(hits)
        need = self.blocks_for(num_tokens) - len(table)
        assert need <= len(self.free_pool), "allocate() without can_allocate()"
        if need > 0:
            self._take_free(table, need)
        if was_empty and table:
            self.num_holders += 1

    def allocate_next(self, request: Request) -> None:
        """allocate() of one block more for a request that holds blocks: a decode step's next slot
        (engine.core.fast_forward books them without a plan)."""
        assert request.block_table and self.free_pool, "allocate_next() of a request with no blocks, or none free"
        self._take_free(request.block_table, 1)

    def _take_free(self, table: list[int], count: int) -> None:
        """Append the count least recently freed blocks to table, each held once, its prefix-cache
        key dropped (one call for a request's blocks: a prefill takes several)."""
        pop, keys, refs = self.free_pool.popitem, self.block_keys, self.ref_counts
        self.num_taken += count
        for _ in range(count):
            block, _ = pop(last=False)
            key = keys[block]
            if key is not None:
                if self.key_to_block.get(key) == block:
                    del self.key_to_block[key]
                keys[block] = self.block_parent_keys[block] = self.block_tokens[block] = None
                self.evictions += 1
            refs[block] = 1
            table.append(block)

    def record_lookup(self, request: Request, num_hits: int) -> None:
        """Count misses for a lookup whose hits were taken (hits are counted by allocate)."""
        if self.enable_prefix_caching:
            self.misses += (request.num_tokens - 1) // self.block_size - num_hits

    def free(self, request: Request) -> None:
        """Drop the request's references; blocks nobody holds return to the pool, tail first."""
        self.free_table(request.block_table)
        request.block_table = []
        request.num_registered_blocks = 0

    def free_table(self, table: list[int]) -> None:
        """Drop one holder's references to the blocks of table (free() without a Request)."""
        if table:
            self.num_holders -= 1
        for block in reversed(table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_pool[block] = None
            else:
                self.num_extra_refs -= 1

    def register_computed(self, request: Request, num_known_tokens: int | None = None) -> None:
        """Offer the request's newly full, computed blocks to the prefix cache.

        num_known_tokens: only the first this many tokens are real (the rest are placeholders of
        sampled tokens not yet known): a block that reaches past them waits.
        """
        if self.enable_prefix_caching:
            request.num_registered_blocks = self._register(request, request.block_table, request.num_registered_blocks,
                                                           num_known_tokens)

    def register_freed(self, request: Request, table: list[int], num_registered: int, num_known_tokens: int) -> None:
        """register_computed() for blocks the request held when it was freed (table, of which the first
        num_registered were offered then): still in the pool with their content, as nothing was taken
        from it since (num_taken, which the caller read then)."""
        if self.enable_prefix_caching:
            self._register(request, table, num_registered, num_known_tokens)

    def _register(self, request: Request, table: list[int], start: int, num_known_tokens: int | None) -> int:
        """Offer blocks start.. of table that the request's known, computed tokens fill; returns
        how many of its blocks are offered now."""
        computed = request.num_computed_tokens
        if num_known_tokens is not None and num_known_tokens < computed:
            computed = num_known_tokens
        full = computed // self.block_size
        if full <= start:
            return start
        hashes = request.block_hashes
        if len(hashes) < start:
            self._extend_hashes(request, start)
        size = self.block_size
        tokens, key_to_block = request.token_ids, self.key_to_block
        for i in range(start, full):
            ids = tokens[i * size : (i + 1) * size]  # (one slice: hashed here if not yet, and kept)
            parent = hashes[i - 1] if i else _NO_PARENT
            if i == len(hashes):
                hashes.append(self._hash_block(parent, ids))
            key = hashes[i]
            block = table[i]
            if key in key_to_block:
                continue  # computed twice in one step by two requests: the first copy serves
            key_to_block[key] = block
            self.block_keys[block] = key
            self.block_parent_keys[block] = parent
            self.block_tokens[block] = ids
        return full

    def _extend_hashes(self, request: Request, num_blocks: int) -> None:
        hashes = request.block_hashes
        size = self.block_size
        tokens = request.token_ids
        hash_block = self._hash_block
        for i in range(len(hashes), num_blocks):
            hashes.append(hash_block(hashes[i - 1] if i else _NO_PARENT, tokens[i * size : (i + 1) * size]))
