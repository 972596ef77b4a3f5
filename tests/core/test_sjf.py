"""Shortest job first (engine/core/policies/sjf.py): the waiting queue's order is the policy's.

The scheduler's invariants hold under it (the property tests of test_scheduler_properties, rerun
with policy="sjf"), the overlapped loop makes its decisions as the plain one does, requests are
admitted shortest prompt first, and a worked example shows the order differ from FCFS.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings

from engine.core import (
    Request,
    SamplingParams,
    SchedulerConfig,
    StepResult,
    make_scheduler,
)
from engine.core.policies import POLICIES
from engine.core.policies.sjf import ShortestFirstQueue
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor, backend_info
from tests.core.test_overlap import _decisions, _outputs
from tests.core.test_overlap import _serve as _serve_overlap
from tests.core.test_scheduler_properties import (
    _serve,
    check_every_request_finishes_once_with_its_tokens,
    check_step_limits_and_plan_consistency,
    workloads,
)


def _sjf(case):
    config, block_size, num_blocks, specs = case
    return replace(config, policy="sjf"), block_size, num_blocks, specs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_sjf_serves_every_request_once_with_its_tokens(case):
    check_every_request_finishes_once_with_its_tokens(_sjf(case))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_sjf_keeps_step_limits_and_plan_consistency(case):
    check_step_limits_and_plan_consistency(_sjf(case))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_sjf_admits_requests_shortest_prompt_first(case):
    # Every request arrives before the first step, so first admissions follow the queue's order.
    config, block_size, num_blocks, specs = _sjf(case)
    _, executor, requests, _ = _serve(config, block_size, num_blocks, specs)
    admitted: list[str] = []
    for plan in executor.plans:
        admitted += [e.request_id for e in plan.scheduled if e.request_id not in admitted]
    by_length = sorted(range(len(specs)), key=lambda i: (len(specs[i][0]), i))
    assert admitted == [requests[i].request_id for i in by_length]


# q4 (shorter) first: booked to finish in its decode step while the token that step computes is
# still pending, it frees its blocks unhashed; the plain loop offered the last one, which q0 hits
_PENDING_LAST_BLOCK = (SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=96, max_model_len=96,
                                       enable_chunked_prefill=False), 1, 12,
                       [([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 10, 0], 1), ([0], 1), ([0], 1), ([0], 1),
                        ([5, 6, 7, 8, 9, 10, 11, 12, 13, 14], 2)])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
@example(_PENDING_LAST_BLOCK)
def test_sjf_runs_overlapped_with_the_same_decisions(case):
    config, block_size, num_blocks, specs = _sjf(case)
    _, plain, plain_result = _serve_overlap(FakeExecutor, config, block_size, num_blocks, specs)
    scheduler, overlapped, result = _serve_overlap(OverlappingFakeExecutor, config, block_size, num_blocks, specs)
    assert _decisions(overlapped) == _decisions(plain)
    assert _outputs(result) == _outputs(plain_result)
    assert not scheduler.has_unfinished() and scheduler.block_manager.num_free_blocks == num_blocks


def _first_step(policy):
    config = SchedulerConfig(policy=policy, max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    scheduler = make_scheduler(config, backend_info(num_blocks=32, block_size=4))
    for rid, length in (("long", 40), ("short", 5), ("medium", 12)):
        scheduler.add(Request(rid, list(range(1, length + 1)), SamplingParams(max_tokens=4, ignore_eos=True)))
    queued = [r.request_id for r in scheduler.waiting]
    return queued, scheduler.schedule()


def test_worked_example_sjf_admits_the_short_prompts_that_fcfs_keeps_waiting():
    # A budget of 16 tokens per step. FCFS (mixed) spends the first step on a 16-token chunk of
    # the 40-token prompt that came first; SJF prefills the 5-token prompt whole, then 11 tokens
    # of the 12-token one, and starts the long prompt only when both are running.
    queued, plan = _first_step("mixed")
    assert queued == ["long", "short", "medium"]
    assert [(e.request_id, e.num_new_tokens) for e in plan.scheduled] == [("long", 16)]

    queued, plan = _first_step("sjf")
    assert queued == ["short", "medium", "long"]
    assert [(e.request_id, e.num_new_tokens) for e in plan.scheduled] == [("short", 5), ("medium", 11)]


def test_a_preempted_request_goes_back_ahead_of_shorter_new_ones():
    queue = ShortestFirstQueue()
    requests = {rid: Request(rid, [1] * n, SamplingParams(max_tokens=1)) for rid, n in
                (("a", 10), ("b", 3), ("c", 3), ("p", 30), ("q", 20))}
    for rid in "abc":
        queue.add_request(requests[rid])
    queue.prepend_request(requests["p"])
    queue.prepend_request(requests["q"])  # preempted after p: resumes first, as FCFS would
    assert [r.request_id for r in queue] == ["q", "p", "b", "c", "a"]
    queue.remove_request(requests["b"])
    queue.remove_request(requests["p"])
    assert len(queue) == 3 and queue.peek_request() is requests["q"]
    assert [queue.pop_request().request_id for _ in range(3)] == ["q", "c", "a"]
    assert not queue


def test_a_short_arrival_goes_ahead_of_a_waiting_long_prompt():
    # A short request that arrives while a long one is being prefilled waits ahead of a longer one.
    config = SchedulerConfig(policy="sjf", max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    scheduler = make_scheduler(config, backend_info(num_blocks=32, block_size=4))
    scheduler.add(Request("long", list(range(40)), SamplingParams(max_tokens=2, ignore_eos=True)))
    scheduler.add(Request("longer", list(range(50)), SamplingParams(max_tokens=2, ignore_eos=True)))
    plan = scheduler.schedule()
    scheduler.update(plan, StepResult([1] * len(plan.scheduled), 0.0))
    scheduler.add(Request("short", [7, 8, 9], SamplingParams(max_tokens=2, ignore_eos=True)))
    assert [r.request_id for r in scheduler.waiting] == ["short", "longer"]


def test_every_registered_policy_is_accepted_and_a_wrong_one_is_refused_in_one_line():
    assert set(POLICIES.names()) >= {"nano", "mixed", "sjf"}
    for name in POLICIES.names():
        assert make_scheduler(SchedulerConfig(policy=name), backend_info(8, 16)).policy.__class__ is POLICIES.get(name)
    with pytest.raises(ValueError) as error:
        SchedulerConfig(policy="bogus")
    message = str(error.value)
    assert "\n" not in message and "scheduler.policy" in message and "'bogus'" in message
    assert all(repr(name) in message for name in POLICIES.names())
