"""Host cost of one decode step of the core: schedule() + update() with 512 running requests,
plain and overlapped (the overlapped step books placeholders in schedule() and writes over them
in update(); here the two run back to back, which is what the host pays per step either way).

Target: under 1 ms on one core, so the scheduler never dominates a GPU step.
Measure:  python -m pytest tests/core/test_bench_scheduler.py --benchmark-enable
(the default test run only executes it once, as a correctness check of the setup).
"""

from __future__ import annotations

import pytest

from engine.core import Request, SamplingParams, SchedulerConfig, StepResult, make_scheduler
from tests.core.fakes import backend_info

NUM_RUNNING = 512


@pytest.mark.parametrize("policy", ["nano", "mixed"])
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_decode_step_host_cost(benchmark, policy, block_size, overlap):
    config = SchedulerConfig(policy=policy, max_num_seqs=NUM_RUNNING, max_num_batched_tokens=65536, max_model_len=8192)
    info = backend_info(NUM_RUNNING * 8192 // block_size, block_size, overlaps_steps=overlap)
    scheduler = make_scheduler(config, info)
    for i in range(NUM_RUNNING):
        prompt = [(i * 7 + j) % 32000 for j in range(100 + i % 400)]
        scheduler.add(Request(f"req-{i}", prompt, SamplingParams(max_tokens=7000, ignore_eos=True)))
    while scheduler.waiting:  # prefill everyone
        plan = scheduler.schedule()
        scheduler.update(plan, StepResult([1] * len(plan.scheduled), 0.0))

    def step():
        plan = scheduler.schedule()
        scheduler.update(plan, StepResult([42] * len(plan.scheduled), 0.0))
        return plan

    plan = benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=20)
    assert plan.stats.kind == "decode" and plan.stats.num_requests == NUM_RUNNING
    assert plan.stats.num_preempted == 0
