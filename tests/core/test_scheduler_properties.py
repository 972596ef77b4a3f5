"""Hypothesis tests of the Scheduler through the shared loop, with a fake executor.

Tokens from the fake depend only on (request id, position), so every request's output is fully
determined by its prompt and length: a run under memory pressure (preemptions, recomputation,
prefix reuse) must produce exactly the tokens of an unconstrained run.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.loop import SimulatedClock, run
from tests.core.fakes import FakeExecutor

SHARED = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    max_model_len = 96
    n = draw(st.integers(1, 14))
    specs = []
    for _ in range(n):
        prefix = SHARED[: draw(st.integers(0, len(SHARED)))]
        suffix = draw(st.lists(st.integers(0, 40), min_size=1 if not prefix else 0, max_size=40))
        prompt = prefix + suffix
        max_tokens = draw(st.integers(1, max_model_len - len(prompt)))
        specs.append((prompt, max_tokens))
    need = max(-(-(len(p) + m - 1) // block_size) for p, m in specs)
    num_blocks = draw(st.integers(need, need * 4))
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max_num_seqs, 128))
    chunked = draw(st.booleans())
    if not chunked:
        budget = max(budget, max_model_len)
    config = SchedulerConfig(
        policy=draw(st.sampled_from(["nano", "mixed"])),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        enable_chunked_prefill=chunked,
    )
    return config, block_size, num_blocks, specs


def _serve(config, block_size, num_blocks, specs):
    executor = FakeExecutor(num_blocks, block_size)
    scheduler = make_scheduler(config, executor.info())
    requests = [Request(f"q{i}", p, SamplingParams(max_tokens=m, ignore_eos=True)) for i, (p, m) in enumerate(specs)]
    return scheduler, executor, requests, run(scheduler, executor, requests, SimulatedClock())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_request_finishes_once_with_its_tokens(case):
    check_every_request_finishes_once_with_its_tokens(case)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_step_limits_and_plan_consistency(case):
    check_step_limits_and_plan_consistency(case)


def check_every_request_finishes_once_with_its_tokens(case):
    config, block_size, num_blocks, specs = case
    scheduler, executor, requests, result = _serve(config, block_size, num_blocks, specs)
    assert not result.rejected
    assert [r.request_id for r in result.requests] == [r.request_id for r in requests]
    for request, (prompt, max_tokens) in zip(result.requests, specs):
        assert request.num_output_tokens == max_tokens
        assert request.prompt_token_ids == prompt
        assert request.finish_reason.value == "length"
    assert not scheduler.has_unfinished()
    assert scheduler.block_manager.num_free_blocks == num_blocks

    # The same workload with a cache that never runs out gives the same tokens.
    roomy = len(specs) * (-(-96 // block_size))
    _, _, _, reference = _serve(config, block_size, roomy, specs)
    assert [r.token_ids for r in result.requests] == [r.token_ids for r in reference.requests]


def check_step_limits_and_plan_consistency(case):
    config, block_size, num_blocks, specs = case
    _, executor, _, result = _serve(config, block_size, num_blocks, specs)
    for plan in executor.plans:
        assert plan.scheduled, "the loop never executes an empty step"
        assert plan.num_tokens <= config.max_num_batched_tokens
        assert sum(len(e.token_ids) for e in plan.scheduled) == plan.num_tokens
        assert len(plan.scheduled) <= config.max_num_seqs
        assert plan.stats.num_running <= config.max_num_seqs
        ids = [e.request_id for e in plan.scheduled]
        assert len(ids) == len(set(ids))
        if config.policy == "nano":
            assert plan.stats.kind in ("prefill", "decode")
        slots = set()
        for entry in plan.scheduled:
            assert len(entry.block_table) * block_size >= entry.context_len
            for pos in range(entry.num_computed_tokens, entry.context_len):
                slots.add(entry.block_table[pos // block_size] * block_size + pos % block_size)
        assert len(slots) == plan.num_tokens, "two tokens of one step write the same KV slot"
    assert sum(s.stats.num_preempted for s in result.steps) == sum(r.num_preemptions for r in result.requests)


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(["nano", "mixed"]), seed=st.integers(0, 10_000))
def test_small_cache_preempts_and_still_finishes(policy, seed):
    import random

    rng = random.Random(seed)
    specs = [([rng.randrange(100) for _ in range(rng.randint(20, 40))], rng.randint(30, 50)) for _ in range(8)]
    config = SchedulerConfig(policy=policy, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128)
    need = max(-(-(len(p) + m - 1) // 4) for p, m in specs)
    scheduler, _, _, result = _serve(config, 4, need + 2, specs)
    assert scheduler.num_preemptions > 0
    assert sum(r.num_preemptions for r in result.requests) == scheduler.num_preemptions
    assert sum(r.num_recomputed_tokens for r in result.requests) > 0
    assert all(r.num_output_tokens == m for r, (_, m) in zip(result.requests, specs))
