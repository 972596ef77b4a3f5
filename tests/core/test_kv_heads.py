"""The KV head plan between replicas of two TP sizes (engine.core.kv_heads): every head each
destination rank holds arrives exactly once, from a source rank that holds it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.kv_heads import HeadPiece, busiest_rank_heads, check_kv_split, kv_heads_held, reshard_plan


@st.composite
def splits(draw):
    """A KV head count and two TP sizes that each divide it or are a multiple of it."""
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
    sizes = sorted({d for d in range(1, heads + 1) if heads % d == 0} | {heads * m for m in (2, 3, 4)})
    return heads, draw(st.sampled_from(sizes)), draw(st.sampled_from(sizes))


@given(splits())
def test_every_destination_head_arrives_once_from_a_rank_that_holds_it(split):
    heads, src_tp, dst_tp = split
    plan = reshard_plan(heads, src_tp, dst_tp)
    for dst in range(dst_tp):
        received = Counter(h for p in plan if p.dst == dst for h in range(p.first, p.first + p.count))
        assert received == Counter(kv_heads_held(heads, dst_tp, dst)), (dst, plan)
    for piece in plan:
        assert piece.count >= 1
        held = kv_heads_held(heads, src_tp, piece.src)
        assert held.start <= piece.first and piece.first + piece.count <= held.stop
    # one piece per pair of ranks: one message each way
    assert len({(p.src, p.dst) for p in plan}) == len(plan)


@given(splits())
def test_ranks_hold_every_head_and_replicas_are_consecutive(split):
    heads, tp, _ = split
    held = [kv_heads_held(heads, tp, r) for r in range(tp)]
    assert {h for r in held for h in r} == set(range(heads))
    assert all(len(r) == max(1, heads // tp) for r in held)
    assert [r.start for r in held] == sorted(r.start for r in held)


@given(splits())
def test_equal_tp_sizes_pair_every_rank_with_itself(split):
    heads, tp, _ = split
    assert reshard_plan(heads, tp, tp) == tuple(
        HeadPiece(r, r, kv_heads_held(heads, tp, r).start, max(1, heads // tp)) for r in range(tp))


@given(splits())
def test_the_busiest_gpu_moves_the_total_over_the_smaller_tp_size_rounded_up(split):
    """Each GPU on its own link: the transfer takes the busiest GPU's share, the receiving pool's
    total over min(tp_prefill, tp_decode), rounded up to whole heads (one KV head replicated on 3
    decode ranks from 2 prefill ranks: one of them sends it twice)."""
    heads, src_tp, dst_tp = split
    plan = reshard_plan(heads, src_tp, dst_tp)
    total = sum(p.count for p in plan)
    assert total == dst_tp * max(1, heads // dst_tp)
    assert busiest_rank_heads(plan) == -(-total // min(src_tp, dst_tp))


def test_the_tiny_models_two_heads_split_and_join():
    assert reshard_plan(2, 1, 2) == (HeadPiece(0, 0, 0, 1), HeadPiece(0, 1, 1, 1))
    assert reshard_plan(2, 2, 1) == (HeadPiece(0, 0, 0, 1), HeadPiece(1, 0, 1, 1))
    # four ranks replicate two heads: each replica receives its head, the sources share the work
    assert reshard_plan(2, 4, 2) == (HeadPiece(0, 0, 0, 1), HeadPiece(3, 1, 1, 1))
    assert reshard_plan(2, 1, 4)[3] == HeadPiece(0, 3, 1, 1)
    assert HeadPiece(0, 1, 1, 1).local(2, 2, 1) == slice(0, 1)


@pytest.mark.parametrize("heads, tp", [(8, 3), (4, 6), (0, 1), (2, 0)])
def test_a_tp_size_that_does_not_split_the_heads_is_one_line(heads, tp):
    with pytest.raises(ValueError, match="must divide or be a multiple of num_key_value_heads") as error:
        check_kv_split(heads, tp)
    assert "\n" not in str(error.value)
