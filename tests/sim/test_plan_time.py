"""When the simulated loop plans a step (engine.core.loop.Replica.plan_time): after the submit()
of the prefill step in flight returned, so what arrives during a prefill's launches joins the next
step, as the engine's loop admits it (experiments/fidelity/code_completion_h100/admission.md)."""

from __future__ import annotations

import pytest

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.executor import BackendInfo
from engine.core.loop import SimulatedClock, run
from sim.executor import SimExecutor

PREFILL_S, DECODE_S = 0.010, 0.002


class _Fixed:
    """Prefill steps 10 ms, decode steps 2 ms; a prefill's launches take `launch` seconds, a decode
    step's decode_launch."""

    def __init__(self, launch: float, decode_launch: float = DECODE_S) -> None:
        self.launch, self.decode_launch = launch, decode_launch
        self.last_launch_s = 0.0

    def step_time(self, plan) -> float:
        prefill = plan.stats.kind != "decode"
        self.last_launch_s = self.launch if prefill else self.decode_launch
        return PREFILL_S if prefill else DECODE_S

    def drained(self) -> None:
        pass


def _serve(launch: float, arrival: float, fast: bool = True, decode_launch: float = DECODE_S, watched: bool = False,
           after_launches: bool = True):
    info = BackendInfo(num_blocks=64, block_size=4, vocab_size=97, eos_token_ids=(5,), overlaps_steps=True)
    executor = SimExecutor(_Fixed(launch, decode_launch), info, seed=1, fast_forward=fast,
                           plan_after_launches=after_launches)
    if watched:  # a step hook (harness.output.recording's) wraps each submitted step
        executor.observe(lambda plan, result, timing: None)
    scheduler = make_scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=60),
                               executor.info())
    requests = [Request("a", [1] * 8, SamplingParams(max_tokens=4, ignore_eos=True), arrival_time=0.0),
                Request("b", [2] * 8, SamplingParams(max_tokens=4, ignore_eos=True), arrival_time=arrival)]
    result = run(scheduler, executor, requests, SimulatedClock())
    return [s.stats.kind for s in result.steps], {r.request_id: r for r in result.requests}


@pytest.mark.parametrize("fast,watched", [(True, False), (False, False), (True, True)])
def test_an_arrival_during_a_prefills_launches_joins_the_next_step(fast, watched):
    """b arrives 6 ms after a's prefill was planned: with 8 ms of launches the loop plans the next
    step after it and prefills b there (nano: prefills first), before a's first decode; with no
    launches priced the next step is planned at once, a's decode, and b waits a step."""
    kinds, requests = _serve(0.008, 0.006, fast, watched=watched)
    assert kinds[:3] == ["prefill", "prefill", "decode"]
    assert requests["b"].first_token_time == pytest.approx(2 * PREFILL_S)
    kinds, requests = _serve(0.0, 0.006, fast)
    assert kinds[:3] == ["prefill", "decode", "prefill"]
    assert requests["b"].first_token_time == pytest.approx(2 * PREFILL_S + DECODE_S)


def test_an_arrival_after_the_launches_waits():
    """b arrives after the prefill's 4 ms of launches: the next step is planned without it."""
    kinds, _ = _serve(0.004, 0.006)
    assert kinds[:3] == ["prefill", "decode", "prefill"]


@pytest.mark.parametrize("fast", [True, False])
def test_a_decode_steps_launch_does_not_delay_the_plan(fast):
    """Only a prefill in flight delays the plan: with a's first decode step reporting 30 ms of
    launches, b (15 ms) still waits for a's decodes, planned on the clock (Replica.plan_time)."""
    kinds, _ = _serve(0.0, 0.015, fast, decode_launch=0.030)
    assert kinds[:5] == ["prefill", "decode", "decode", "decode", "prefill"]


def test_plan_after_launches_off_plans_at_once():
    """backend.plan_after_launches=false: the launches are priced but the plan does not wait for them."""
    assert _serve(0.008, 0.006, after_launches=False)[0] == _serve(0.0, 0.006)[0]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_plan_after_launches_setting_is_a_bool(value):
    from sim.config import SimConfig

    with pytest.raises(ValueError, match="plan_after_launches"):
        SimConfig(plan_after_launches=value)
