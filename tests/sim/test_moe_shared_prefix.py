"""Shared-prefix routing: sequences that start with the same tokens form routing groups
(sim.features.routing_sequences, row_routing_sequences; docs/moe-pricing.md), priced as one
sequence without measured figures (how alike their members route: test_moe_shared_routing.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import SchedulerConfig
from engine.core.plan import KVCacheSpec
from harness.calibration.grid import ProfileGrid, build_plan
from sim.config import SimConfig
from sim.features import routing_sequences, row_routing_sequences, step_features
from sim.moe_locality import SequenceRouting

SPEC = KVCacheSpec(num_blocks=4000, block_size=16)
SCHED = SchedulerConfig(policy="mixed", max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=1024)


def plan_of(entries):
    return build_plan(entries, SPEC, SCHED, np.random.default_rng(0), 1000)


def test_neutral_is_todays_count():
    routing = SequenceRouting(128, 8, 0.4, 2.0)
    plan = plan_of([(1, 40 + i, True, (i % 2, 32)) for i in range(8)] + [(24, 0, False)])
    apart = step_features(plan, (), routing.distinct)["moe_distinct_experts"]
    assert apart == pytest.approx(routing.distinct([1] * 8 + [24]))
    # sequences that share nothing: grouping changes nothing
    alone = plan_of([(1, 40 + i, True) for i in range(8)] + [(24, 0, False)])
    assert step_features(alone, (), routing.distinct, True) == step_features(alone, (), routing.distinct)


@pytest.mark.parametrize("locality", [0.0, 0.5, 2.0])
def test_fully_shared_batch_is_one_sequence(locality):
    routing = SequenceRouting(128, 8, 0.379, locality)
    plan = plan_of([(1, 48 + i, True, (0, 48)) for i in range(32)])
    assert routing_sequences(plan) == [(1,) * 32]
    shared = step_features(plan, (), routing.distinct, True)["moe_distinct_experts"]
    assert shared == pytest.approx(routing.distinct([32]))
    apart = step_features(plan, (), routing.distinct)["moe_distinct_experts"]
    assert shared < apart if locality else shared == pytest.approx(apart)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=2, max_size=12), cut=st.integers(1, 11),
       locality=st.floats(0.0, 10.0), skew=st.floats(0.0, 1.5))
def test_merging_sequences_never_adds_experts(sizes, cut, locality, skew):
    """Monotone: a step whose sequences are grouped into fewer routing sequences touches no more
    experts, and as many at locality 0."""
    routing = SequenceRouting(64, 6, skew, locality)
    cut = min(cut, len(sizes) - 1)
    merged = [sum(sizes[:cut])] + sizes[cut:]
    fully = [sum(sizes)]
    assert routing.distinct(fully) <= routing.distinct(merged) + 1e-9 <= routing.distinct(sizes) + 2e-9
    if locality == 0.0:
        assert routing.distinct(fully) == pytest.approx(routing.distinct(sizes))


def test_grid_rows_group_as_their_plans():
    """A profile row's groups (its totals and moe_routing_groups) give the routing sequences its
    plan gives, for every shape of the quick grid: grid rows and served steps are priced alike."""
    grid = ProfileGrid.quick()
    rng = np.random.default_rng(grid.seed)
    sched = SchedulerConfig(policy="mixed", max_num_seqs=64, max_num_batched_tokens=1024, max_model_len=512)
    shared = 0
    for shape_set, _, entries in list(grid.shapes(sched, rng, SPEC)):
        plan = build_plan(entries, SPEC, sched, rng, 1000)
        if plan is None:
            continue
        f = step_features(plan)
        groups = routing_sequences(plan)
        shared += len(groups) < len(plan.scheduled)
        row = row_routing_sequences(f["num_prefill_tokens"], f["num_decode_tokens"], f["num_seqs"], len(groups))
        if shape_set == "grid":  # random shapes' ragged chunks are evened out (row_sequences)
            assert sorted(sorted(g) for g in row) == sorted(sorted(g) for g in groups)
    assert shared >= 5


def test_config_refuses_a_non_bool():
    with pytest.raises(ValueError, match="moe_routing_shared_prefix"):
        SimConfig(moe_routing_shared_prefix="yes")  # type: ignore[arg-type]


def _serve_one_step(prompts, caching=True, block_size=16):
    """The first plan of a scheduler given these prompts at once (engine.core, the served path)."""
    from engine.core import Request, SamplingParams, make_scheduler
    from engine.core.executor import BackendInfo

    info = BackendInfo(num_blocks=64, block_size=block_size, vocab_size=1000, eos_token_ids=(1,))
    config = SchedulerConfig(policy="mixed", max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256)
    scheduler = make_scheduler(config, info)
    scheduler.block_manager.enable_prefix_caching = caching
    for i, prompt in enumerate(prompts):
        scheduler.add(Request(f"r{i}", prompt, SamplingParams(max_tokens=4)))
    return scheduler.schedule()


@pytest.mark.parametrize("caching", [True, False])
def test_prompts_that_start_alike_group_whichever_blocks_hold_them(caching):
    """Two prompts with the same first block, prefilled in one step, hold that prefix in blocks of
    their own (no cache hit yet) and still form one routing group; a prompt shorter than a block,
    or one that starts otherwise, stays apart."""
    prefix = list(range(100, 132))  # two blocks of 16
    plan = _serve_one_step([prefix + [7, 8, 9], prefix + [4, 5], list(range(300, 340)), [2, 3, 4]], caching)
    first_blocks = [e.block_table[0] for e in plan.scheduled]
    assert len(set(first_blocks)) == 4  # no two share a block
    assert sorted(routing_sequences(plan)) == sorted([(35, 34), (40,), (3,)])


def test_fast_forward_keeps_each_entrys_prefix_key():
    """A booked decode run's entries (engine.core.fast_forward_parts.shifted) keep their keys."""
    from engine.core.fast_forward_parts import shifted

    plan = _serve_one_step([list(range(100, 120)) + [i] for i in range(3)])
    keys = [e.prefix_key for e in plan.scheduled]
    assert keys[0] is not None and len(set(keys)) == 1
    assert [e.prefix_key for e in shifted(plan, 5).scheduled] == keys


def test_config_refuses_figures_without_groups():
    with pytest.raises(ValueError, match="SimConfig.moe_routing_shared_fresh.*moe_routing_shared_prefix=true"):
        SimConfig(moe_routing_shared_fresh=0.1)
    with pytest.raises(ValueError, match="SimConfig.moe_routing_shared_cap"):
        SimConfig(moe_routing_shared_prefix=True, moe_routing_shared_fresh=0.1, moe_routing_shared_cap=0)
    assert SimConfig(moe_routing_shared_prefix=True, moe_routing_shared_fresh=0.1, moe_routing_shared_cap=3)
