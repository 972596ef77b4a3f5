"""A replica's capacity is its binding resource (harness.autoscale.capacity, harness.autoscale.demand):
the token rate its steps reach at the full token budget, priced from the step model, or the requests
its sequence slots and KV hold over their time in service. A replica bound by its prompt tokens
never reaches its admission limit, and the policies still size a surge on it at the first decision."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import SchedulerConfig
from engine.core.elastic import FleetSignal, ReplicaLimits, ReplicaSignal
from harness.autoscale.capacity import BUCKET_TOKENS, PromptPricer
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.demand import Demand
from harness.autoscale.policies import make_policy
from harness.autoscale.run import run_autoscaled
from harness.config import build_run_config
from harness.fleet.config import FleetConfig, build_fleet
from tests.harness.conftest import compose_config


def _linear(fixed_s: float, per_token_s: float, plans: list):
    def step_time(plan) -> float:
        plans.append(plan)
        return fixed_s + per_token_s * sum(len(e.token_ids) for e in plan.scheduled)
    return step_time


@settings(max_examples=80, deadline=None)
@given(prompt=st.integers(1, 40_000), budget=st.integers(64, 20_000), seqs=st.integers(1, 64))
def test_the_priced_steps_are_the_schedulers_full_steps(prompt, budget, seqs):
    """Each step holds at most max_num_seqs prompts and the budget, is full unless the sequence slots
    bind, covers the context it attends to with blocks, and a prompt's chunks follow each other."""
    plans: list = []
    pricer = PromptPricer(_linear(0.01, 1e-5, plans), SchedulerConfig(max_num_seqs=min(seqs, budget),
                                                                        max_num_batched_tokens=budget), 16)
    rate = pricer(prompt)
    bucket = max(1, round(prompt / BUCKET_TOKENS)) * BUCKET_TOKENS
    assert len(plans) >= 2
    tokens = 0
    last_end = 0  # where the prompt in progress stood after the previous chunk
    for plan in plans:
        n = [len(e.token_ids) for e in plan.scheduled]
        assert len(n) <= min(seqs, budget) and sum(n) <= budget
        assert sum(n) == budget or len(n) == min(seqs, budget)
        for entry in plan.scheduled:
            assert entry.num_computed_tokens in (0, last_end)
            assert len(entry.block_table) * 16 >= entry.context_len
            last_end = 0 if entry.sample else entry.context_len
            assert entry.sample == (entry.context_len == bucket)
        tokens += sum(n)
    assert math.isclose(rate, tokens / sum(0.01 + 1e-5 * sum(len(e.token_ids) for e in p.scheduled) for p in plans))
    assert tokens >= bucket  # at least one whole prompt
    pricer(prompt)
    assert len(plans) == len(set(map(id, plans)))  # a bucket is priced once


def _signal(limits: ReplicaLimits, rate: float, prompt: float, output: float, service_s: float) -> FleetSignal:
    # not at its admission limit (no full replica measured); a start-up of 0: no queue outlasts it
    serving = (ReplicaSignal(4, 0, 0.3),)
    return FleetSignal(100.0, serving, 0, 0, (5.0,) * 10, (), (), rate, service_s, 0.0, prompt, output, limits)


def test_the_binding_resource_sizes_the_scale_up():
    # 10,000 tokens/s over 1,100 tokens a request: 9.1 req/s, where 256 slots over 2 s hold 128
    by_tokens = ReplicaLimits(256, 10**7, lambda prompt: 10_000.0)
    assert math.isclose(Demand().capacity(_signal(by_tokens, 40.0, 1000.0, 100.0, 2.0)), 10_000 / 1100)
    # the same token rate, KV for 10 such requests: 5 req/s
    by_kv = ReplicaLimits(256, 11_000, lambda prompt: 10_000.0)
    assert math.isclose(Demand().capacity(_signal(by_kv, 40.0, 1000.0, 100.0, 2.0)), 5.0)
    # no token pricing (a decode pool): the slots
    by_seqs = ReplicaLimits(8, 10**7)
    assert math.isclose(Demand().capacity(_signal(by_seqs, 40.0, 1000.0, 100.0, 2.0)), 4.0)
    for limits, want in ((by_tokens, 5), (by_kv, 8), (by_seqs, 10)):
        for policy in ("slo", "queue"):
            config = AutoscaleConfig(policy=policy, target_waiting=0.5)
            signal = _signal(limits, 40.0, 1000.0, 100.0, 2.0)
            if policy == "queue":  # the queue policy acts on waiting requests (none queued before the settle)
                signal = FleetSignal(**{**signal.__dict__, "serving": (ReplicaSignal(4, 3, 0.3, 0),)})
            assert make_policy(config, SLO(ttft_p90_s=2.0)).desired(signal) == want, (limits, policy)


def test_without_limits_or_lengths_the_policies_keep_their_fallback():
    signal = FleetSignal(100.0, (ReplicaSignal(4, 0, 0.3),), 0, 0, (5.0,) * 10, (), (), 40.0, 2.0, 60.0)
    assert make_policy(AutoscaleConfig(policy="slo"), SLO(ttft_p90_s=2.0)).desired(signal) == 2  # one more


# prompts of 3,000-4,000 tokens and 2-4 output tokens: one Qwen3-0.6B replica prefills about 120 a second
# at its 16,384-token budget, far below its 512 sequences; a surge to 300 a second needs 3
PREFILL_BOUND = ["workload.prompt_len.low=3000", "workload.prompt_len.high=4000", "workload.output_len.low=2",
                 "workload.output_len.high=4", "router=least_requests", "workload=poisson",
                 "workload.rate_profile=[[0,2],[20,300],[35,2]]", "workload.duration_s=60"]


def test_a_prefill_bound_surge_is_sized_at_the_first_decision():
    """The settled slo policy started one replica per start-up on such a surge (no replica reaches its
    admission limit); sized on the token rate, its first decision starts what the rate needs."""
    cfg = compose_config(PREFILL_BOUND)
    config = AutoscaleConfig(policy="slo", interval_s=5.0, scale_up_cooldown_s=0.0, scale_down_cooldown_s=1000.0,
                             provision_s=30.0, graph_capture_s=1.0, max_replicas=10, calibration=False)
    out = run_autoscaled(build_run_config(cfg), FleetConfig(replicas=1), build_fleet(cfg)[1], config,
                         SLO(ttft_p90_s=0.5), progress=False)
    ups = [e for e in out.elastic.events if e.direction == "up"]
    assert len(ups) == 1 and 20 < ups[0].time_s <= 30 and len(ups[0].replicas) in (2, 3), ups


def test_a_queue_counts_over_the_evaluation_interval_when_the_start_up_is_shorter():
    """One request queued on a replica that serves 9 a second is no replica's worth of work, even
    with an instant start-up: the next decision comes an interval later. Over a 60 s start-up a
    queue the replica cannot drain (its share is above its capacity) keeps it busy throughout."""
    limits = ReplicaLimits(256, 10**7, lambda prompt: 10_000.0)  # 9.1 req/s of 1,100-token requests
    base = _signal(limits, 5.0, 1000.0, 100.0, 2.0)
    queued = (ReplicaSignal(4, 1, 0.3, 1),)
    assert Demand().needed(FleetSignal(**{**base.__dict__, "serving": queued, "interval_s": 15.0})) == 1
    assert Demand().needed(FleetSignal(**{**base.__dict__, "serving": queued})) == 2  # no interval: all of it
    surge = FleetSignal(**{**base.__dict__, "serving": queued, "arrival_rate": 30.0, "startup_s": 60.0,
                           "interval_s": 15.0})
    assert Demand().needed(surge) == 5  # 30 / 9.1 = 3.3, and the replica busy with its queue
