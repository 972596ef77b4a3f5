"""The numpy xxh64 equals the xxhash package on 8-byte inputs, for any value and seed."""

from __future__ import annotations

import struct

import numpy as np
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from engine.core.executor import BackendInfo
from sim.executor import SimExecutor
from sim.roofline import RooflineCostModel
from sim.xxh import xxh64_range, xxh64_u64
from tests.sim import helpers

U64 = st.integers(0, 2**64 - 1)


@given(st.lists(U64, min_size=1, max_size=50), U64)
def test_xxh64_of_eight_bytes_matches_xxhash(values, seed):
    got = xxh64_u64(np.array(values, dtype=np.uint64), seed).tolist()
    assert got == [xxhash.xxh64_intdigest(struct.pack("<Q", v), seed) for v in values]


@given(st.integers(0, 2**40), st.integers(0, 300), U64)
def test_xxh64_range_matches_xxhash(first, count, seed):
    got = xxh64_range(first, count, seed).tolist()
    assert got == [xxhash.xxh64_intdigest(struct.pack("<Q", p), seed) for p in range(first, first + count)]


@given(st.lists(st.tuples(U64, U64), min_size=1, max_size=50))
def test_xxh64_with_a_seed_per_value_matches_xxhash(pairs):
    values, seeds = (np.array(column, dtype=np.uint64) for column in zip(*pairs))
    got = xxh64_u64(values, seeds).tolist()
    assert got == [xxhash.xxh64_intdigest(struct.pack("<Q", v), s) for v, s in pairs]


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6), st.integers(0, 80)), min_size=1, max_size=12),
       st.integers(0, 2**64 - 1), st.sampled_from([None, 0, 5]))
def test_sample_runs_are_the_tokens_sampled_one_by_one(runs, seed, eos):
    cost = RooflineCostModel(helpers.model("qwen3-0.6b"), helpers.hardware("h100"))
    executor = SimExecutor(cost, BackendInfo(num_blocks=8, block_size=4, vocab_size=97, eos_token_ids=(
        () if eos is None else (eos,))), seed=seed)
    runs = [(f"r{r}", first, count) for r, first, count in runs]
    assert [list(tokens) for tokens in executor.sample_runs(runs)] == [executor.sample_tokens(*run) for run in runs]


@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5000), st.integers(0, 300)), min_size=1,
                         max_size=4), min_size=1, max_size=5), st.integers(0, 2**64 - 1))
def test_sample_runs_of_one_executor_reuse_its_table_of_positions(calls, seed):
    """sample_runs keeps the seedless part of each position's hash and grows it as positions do:
    call after call, the tokens sampled one by one."""
    cost = RooflineCostModel(helpers.model("qwen3-0.6b"), helpers.hardware("h100"))
    executor = SimExecutor(cost, BackendInfo(num_blocks=8, block_size=4, vocab_size=1000), seed=seed)
    for runs in calls:
        runs = [(f"r{r}", first, count) for r, first, count in runs]
        assert [list(tokens) for tokens in executor.sample_runs(runs)] == [executor.sample_tokens(*run) for run in runs]
