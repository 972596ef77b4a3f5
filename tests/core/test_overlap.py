"""The overlapped loop (step N+1 planned before step N's tokens are known) against the plain one.

With ignore_eos the two must make the same decisions step by step and produce the same tokens;
with EOS stops the schedules may differ (a stopped request computes one thrown-away token) but
every request must end with exactly the tokens of the plain run. The fake checks that each
placeholder input is the token its previous step sampled at that position.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.loop import SimulatedClock, run
from engine.core.plan import PLACEHOLDER
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor, backend_info
from tests.core.test_scheduler_properties import workloads

EOS = 7


def _serve(executor_class, config, block_size, num_blocks, specs, eos_every=0, stop=()):
    executor = executor_class(num_blocks, block_size, vocab_size=50, eos_token_id=EOS, eos_every=eos_every)
    scheduler = make_scheduler(config, executor.info())
    requests = [Request(f"q{i}", p, SamplingParams(max_tokens=m, ignore_eos=not eos_every, stop_token_ids=list(stop)))
                for i, (p, m) in enumerate(specs)]
    result = run(scheduler, executor, requests, SimulatedClock())
    return scheduler, executor, result


def _decisions(executor):
    return [[(e.request_id, e.num_computed_tokens, len(e.token_ids), e.sample) for e in plan.scheduled]
            + [tuple(plan.preempted_ids)] for plan in executor.plans]


def _outputs(result):
    return [(r.request_id, r.token_ids, r.finish_reason) for r in result.requests]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_overlapped_loop_makes_the_same_decisions_without_stops(case):
    config, block_size, num_blocks, specs = case
    _, plain, plain_result = _serve(FakeExecutor, config, block_size, num_blocks, specs)
    scheduler, overlapped, result = _serve(OverlappingFakeExecutor, config, block_size, num_blocks, specs)
    assert _decisions(overlapped) == _decisions(plain)
    assert _outputs(result) == _outputs(plain_result)
    assert all(PLACEHOLDER not in r.token_ids for r in result.requests)
    assert not scheduler.has_unfinished() and not scheduler.finishing
    assert scheduler.block_manager.num_free_blocks == num_blocks


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.sampled_from([2, 3, 5]), st.booleans())
def test_overlapped_loop_stops_requests_with_the_same_tokens(case, eos_every, with_stop_token):
    config, block_size, num_blocks, specs = case
    stop = (11, 23) if with_stop_token else ()
    _, _, plain = _serve(FakeExecutor, config, block_size, num_blocks, specs, eos_every, stop)
    scheduler, _, overlapped = _serve(OverlappingFakeExecutor, config, block_size, num_blocks, specs, eos_every, stop)
    assert _outputs(overlapped) == _outputs(plain)
    assert not scheduler.has_unfinished() and not scheduler.waiting and not scheduler.running
    assert scheduler.block_manager.num_free_blocks == num_blocks
    for request in overlapped.requests:
        assert request.num_pending_tokens == 0
        assert request.num_computed_tokens <= request.num_tokens


@settings(max_examples=40, deadline=None)
@given(policy=st.sampled_from(["nano", "mixed"]), seed=st.integers(0, 10_000), eos_every=st.sampled_from([0, 4]))
def test_overlapped_loop_preempts_and_recomputes_like_the_plain_one(policy, seed, eos_every):
    rng = random.Random(seed)
    specs = [([rng.randrange(100) for _ in range(rng.randint(20, 40))], rng.randint(30, 50)) for _ in range(8)]
    config = SchedulerConfig(policy=policy, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128)
    need = max(-(-(len(p) + m - 1) // 4) for p, m in specs)
    _, _, plain = _serve(FakeExecutor, config, 4, need + 2, specs, eos_every)
    scheduler, _, overlapped = _serve(OverlappingFakeExecutor, config, 4, need + 2, specs, eos_every)
    assert _outputs(overlapped) == _outputs(plain)
    if not eos_every:
        assert scheduler.num_preemptions > 0
    assert sum(r.num_preemptions for r in overlapped.requests) == scheduler.num_preemptions


def test_a_request_stopped_by_eos_computes_one_discarded_token_in_the_overlapped_loop():
    # q0 gets EOS as its first output (eos_every=1 makes every sampled token EOS)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    _, executor, result = _serve(OverlappingFakeExecutor, config, 4, 32, [([1, 2, 3], 10)], eos_every=1)
    (request,) = result.requests
    assert request.finish_reason.value == "eos" and request.output_token_ids == [EOS]
    # step 0: the prefill samples EOS; step 1 was planned before that was known: one decode
    assert [len(p.scheduled) for p in executor.plans] == [1, 1]
    assert executor.plans[1].scheduled[0].token_ids == [PLACEHOLDER]
    assert len(result.steps) == 2


def test_a_stale_step_never_writes_into_a_new_request_that_reused_the_id():
    from engine.core.plan import StepResult

    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    scheduler = make_scheduler(config, backend_info(16, 4, EOS, overlaps_steps=True))
    scheduler.add(Request("a", [1, 2, 3], SamplingParams(max_tokens=10)))
    prefill = scheduler.schedule()
    decode = scheduler.schedule()  # planned before the prefill's token is known
    assert decode.scheduled[0].token_ids == [PLACEHOLDER]
    (stopped,) = scheduler.update(prefill, StepResult([EOS], 0.0))
    assert stopped.finish_reason.value == "eos" and stopped.token_ids == [1, 2, 3, EOS]
    reused = Request("a", [5, 6], SamplingParams(max_tokens=4))
    scheduler.add(reused)
    assert scheduler.update(decode, StepResult([99], 0.0)) == []
    assert reused.token_ids == [5, 6] and stopped.token_ids == [1, 2, 3, EOS]
    assert scheduler.block_manager.num_free_blocks == 16
