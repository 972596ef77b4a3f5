"""The KV link's receive staging (engine.core.kv_staging): the budget a disaggregated replica's
memory plan keeps out of its KV cache, and the FIFO rings that bound what its transfers in
flight occupy (back-pressure instead of the unbounded buffers that ran a 3P1D decode replica out
of memory)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_staging import (
    STAGED_REQUESTS_PER_PEER,
    StagingRing,
    link_staging_blocks,
    staging_blocks_per_peer,
)


def test_budget_scales_with_the_peers_in_the_other_pool():
    per_peer = STAGED_REQUESTS_PER_PEER * 32
    assert staging_blocks_per_peer(32) == per_peer
    # 3P1D: the decode replica stages for three prefill peers, each prefill replica for one decode peer
    assert link_staging_blocks("decode", 3, 3, (1, 1, 1, 1), 32) == 3 * per_peer
    assert link_staging_blocks("prefill", 0, 3, (1, 1, 1, 1), 32) == per_peer
    # 1P3D: the other way round
    assert link_staging_blocks("prefill", 0, 1, (1, 1, 1, 1), 32) == 3 * per_peer
    assert link_staging_blocks("decode", 2, 1, (1, 1, 1, 1), 32) == per_peer
    # a peer of another TP size: the regrouped heads pass through one more buffer of the request's size
    assert link_staging_blocks("decode", 1, 1, (2, 1), 32) == 2 * per_peer
    assert link_staging_blocks(None, 0, 0, (1,), 32) == 0  # an aggregated replica


@pytest.mark.parametrize("call", [
    lambda: staging_blocks_per_peer(0), lambda: link_staging_blocks("both", 0, 1, (1, 1), 4),
    lambda: StagingRing(0), lambda: StagingRing(4).take(5), lambda: StagingRing(4).release()])
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_a_full_ring_holds_back_until_its_oldest_is_released():
    ring = StagingRing(10)
    assert [ring.take(4), ring.take(4)] == [0, 4]
    assert not ring.fits(3) and ring.fits(2)
    assert ring.release() == (0, 4)
    assert ring.take(3) == 0  # wraps: the end has 2 free, the start 4
    assert not ring.fits(2) and ring.fits(1)  # [3, 4) between the newest and the oldest
    ring.release()
    ring.release()
    assert ring.in_use == 0 and ring.take(10) == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=80))
def test_ranges_in_flight_never_overlap_nor_leave_the_ring(capacity, ops):
    """Any sequence of takes (when they fit) and FIFO releases: the live ranges lie inside the
    ring, never overlap, and any size up to the capacity fits again once it is empty."""
    ring = StagingRing(capacity)
    live: list[tuple[int, int]] = []
    for take, n in ops:
        n = min(n, capacity)
        if take and ring.fits(n):
            live.append((ring.take(n), n))
        elif live:
            assert ring.release() == live.pop(0)
        cells = [b for start, k in live for b in range(start, start + k)]
        assert len(cells) == len(set(cells)) and all(0 <= b < capacity for b in cells)
        assert ring.in_use == len(cells) <= capacity
        if not live:
            assert ring.fits(capacity)
