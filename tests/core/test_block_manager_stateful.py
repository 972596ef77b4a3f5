"""Hypothesis state machine over the BlockManager: random allocate / compute / append / free /
preempt / re-admit sequences with shared prefixes, checking the pool's invariants after every rule.

A shadow "KV store" records which tokens were written into each block, so a cache hit can be
checked against what was really computed there, not against the manager's own bookkeeping.
"""

from __future__ import annotations

from array import array
from collections import Counter

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.core.block_manager import BlockManager, chain_hash
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams

BLOCK_SIZE = 4
PREFIXES = [[1] * 9, [2, 3] * 5, [7, 8, 9, 10, 11, 12, 13, 14]]


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 24), caching=st.booleans(), packed=st.booleans())
    def setup(self, num_blocks: int, caching: bool, packed: bool) -> None:
        self.bm = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=caching)
        self.packed = packed  # every request's ids an array("q") (the simulator's), else lists
        self.live: list[Request] = []  # requests holding blocks
        self.parked: list[Request] = []  # preempted: no blocks, tokens kept
        self.kv: dict[int, list[int | None]] = {}  # shadow content of each block
        self.counter = 0

    # ---- helpers ---------------------------------------------------------------------

    def _compute(self, request: Request, upto: int) -> None:
        """Pretend the model wrote KV for positions num_computed .. upto - 1."""
        for pos in range(request.num_computed_tokens, upto):
            block = request.block_table[pos // BLOCK_SIZE]
            assert self.bm.ref_counts[block] == 1, "a write must never land in a shared block"
            self.kv.setdefault(block, [None] * BLOCK_SIZE)[pos % BLOCK_SIZE] = request.token_ids[pos]
        request.num_computed_tokens = upto
        self.bm.register_computed(request)

    def _admit(self, request: Request) -> bool:
        hits = self.bm.lookup(request)
        for i, block in enumerate(hits):
            assert self.kv[block] == list(request.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
        if not self.bm.can_allocate(request, request.num_tokens, hits):
            return False
        free_before = self.bm.num_free_blocks
        needed = self.bm.num_blocks_to_allocate(request, request.num_tokens, hits)
        self.bm.allocate(request, request.num_tokens, hits)
        assert self.bm.num_free_blocks == free_before - needed
        request.num_computed_tokens = len(hits) * BLOCK_SIZE
        self._compute(request, request.num_tokens - 1)  # the last token is computed with its decode
        self.live.append(request)
        return True

    # ---- rules -----------------------------------------------------------------------

    @rule(prefix=st.sampled_from(PREFIXES), use_prefix=st.booleans(),
          suffix=st.lists(st.integers(0, 5), min_size=1, max_size=12))
    def add_request(self, prefix: list[int], use_prefix: bool, suffix: list[int]) -> None:
        tokens = (prefix if use_prefix else []) + suffix
        self.counter += 1
        request = Request(f"r{self.counter}", array("q", tokens) if self.packed else tokens,
                          SamplingParams(max_tokens=None))
        self._admit(request)

    @precondition(lambda self: self.parked)
    @rule(data=st.data())
    def readmit_preempted(self, data) -> None:
        request = data.draw(st.sampled_from(self.parked))
        if self._admit(request):
            self.parked.remove(request)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), token=st.integers(0, 5))
    def decode_step(self, data, token: int) -> None:
        request = data.draw(st.sampled_from(self.live))
        # compute the pending last token, then a new token arrives
        if not self.bm.can_allocate(request, request.num_tokens):
            return
        self.bm.allocate(request, request.num_tokens)
        self._compute(request, request.num_tokens)
        request.token_ids.append(token)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data) -> None:
        request = data.draw(st.sampled_from(self.live))
        self.live.remove(request)
        self.bm.free(request)
        assert request.block_table == []

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def preempt(self, data) -> None:
        request = data.draw(st.sampled_from(self.live))
        self.live.remove(request)
        self.bm.free(request)
        request.num_computed_tokens = 0
        self.parked.append(request)

    # ---- invariants --------------------------------------------------------------------

    @invariant()
    def free_xor_used(self) -> None:
        bm = self.bm
        free = set(bm.free_pool)
        assert len(free) == len(bm.free_pool) >= 0
        for block in range(bm.num_blocks):
            assert (block in free) == (bm.ref_counts[block] == 0), block
            assert bm.ref_counts[block] >= 0

    @invariant()
    def refcounts_match_tables(self) -> None:
        holders = Counter(b for r in self.live for b in r.block_table)
        for block in range(self.bm.num_blocks):
            assert self.bm.ref_counts[block] == holders.get(block, 0), block
        for request in self.parked:
            assert request.block_table == []

    @invariant()
    def hash_map_is_sound(self) -> None:
        bm = self.bm
        for key, block in bm.key_to_block.items():
            assert bm.block_keys[block] == key
            tokens = bm.block_tokens[block]
            assert chain_hash(bm.block_parent_keys[block], tokens) == key
            assert self.kv[block] == list(tokens), "cached key names content the block does not hold"
            parent = bm.block_parent_keys[block]
            if parent and parent in bm.key_to_block:
                assert bm.block_keys[bm.key_to_block[parent]] == parent

    def teardown(self) -> None:
        if not hasattr(self, "bm"):
            return
        for request in self.live:
            self.bm.free(request)
        assert self.bm.num_free_blocks == self.bm.num_blocks
        assert all(count == 0 for count in self.bm.ref_counts)


TestBlockManagerMachine = BlockManagerMachine.TestCase
TestBlockManagerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@settings(max_examples=100)
@given(st.integers(0, 2**64 - 1), st.lists(st.integers(0, 2**31), max_size=300))
def test_a_block_key_is_the_hash_of_its_parent_key_and_its_ids_as_int64(parent, token_ids):
    """The key format: xxh64 of the parent key (8 bytes, little-endian) and the ids as native int64."""
    expected = xxhash.xxh64_intdigest(parent.to_bytes(8, "little") + array("q", token_ids).tobytes())
    assert chain_hash(parent, token_ids) == chain_hash(parent, tuple(token_ids)) == expected
    assert chain_hash(parent, array("q", token_ids)) == expected  # packed ids hash their bytes
