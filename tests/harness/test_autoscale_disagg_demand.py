"""Each pool of an autoscaled disaggregated fleet sizes its scale-ups on its own demand: the prefill
pool on the prompt tokens arriving against its replicas' token rate (priced from its step model),
the decode pool on the requests handed to it against what its sequence slots and KV hold over their
time on a decode replica. A prefill-bound surge grows the prefill pool to what it needs at the first
decision and leaves the decode pool alone; a decode-bound surge the other way round."""

from __future__ import annotations

import dataclasses
import math

import pytest

from harness.autoscale.capacity import replica_limits
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.disagg import pool_autoscale, run_disagg_autoscaled
from harness.autoscale.policies import SLOFeedback, Utilisation
from harness.config import build_run_config
from harness.fleet.config import build_fleet
from harness.fleet.disagg_config import build_disagg
from tests.harness.conftest import compose_config

POOL = ("{policy: %s, max_replicas: 8, interval_s: 2, scale_up_cooldown_s: 0, scale_down_cooldown_s: 100, "
        "provision_s: 10, calibration: false, graph_capture_s: 1%s}")
OWN = {"utilisation": ", target_running: 8"}  # a setting of that policy only (the others refuse it)
SURGE = ["fleet=disaggregated", "workload=poisson", "workload.duration_s=60", "scheduler.max_num_seqs=8",
         "fleet.transfer.link=network"]
# Qwen3-0.6B: a prefill replica computes about 430,000 prompt tokens a second of these, 120 requests;
# a surge to 300 a second needs 3. Their 2-4 output tokens leave the decode pool idle.
PREFILL_BOUND = ["workload.prompt_len.low=3000", "workload.prompt_len.high=4000", "workload.output_len.low=2",
                 "workload.output_len.high=4", "workload.rate_profile=[[0,2],[10,300],[30,2]]"]
# a decode replica holds 8 of these for about 0.5 s: 16 a second; a surge to 40 needs 3. Their
# short prompts leave the prefill pool idle.
DECODE_BOUND = ["workload.prompt_len.low=50", "workload.prompt_len.high=100", "workload.output_len.low=200",
                "workload.output_len.high=400", "workload.rate_profile=[[0,2],[10,40],[30,2]]"]
SLO_SET = SLO(ttft_p90_s=0.5, tpot_p90_s=0.05)


def _run(overrides: list[str], policy: str):
    pool = POOL % (policy, OWN.get(policy, ""))
    cfg = compose_config(SURGE + overrides + [f"fleet.prefill.autoscale={pool}", f"fleet.decode.autoscale={pool}"])
    rc = build_run_config(cfg)
    _, router = build_fleet(cfg, with_fleet=False)
    fleet = build_disagg(cfg)
    prefill, decode = pool_autoscale(fleet, AutoscaleConfig(), SLO_SET)
    if policy == "slo":  # the decode pool's latency is its TPOT
        decode = dataclasses.replace(decode, slo_metric="tpot")
    return rc, run_disagg_autoscaled(rc, fleet, router, (prefill, decode), SLO_SET, progress=False)


def _record(monkeypatch, policy_class) -> list:
    """The signals each pool's policy sees, in order."""
    seen: list = []
    desired = policy_class.desired

    def recording(self, signal):
        seen.append(signal)
        return desired(self, signal)
    monkeypatch.setattr(policy_class, "desired", recording)
    return seen


def _ups(history) -> list[tuple[float, int]]:
    return [(e.time_s, len(e.replicas)) for e in history.events if e.direction == "up"]


def test_a_prefill_bound_surge_grows_the_prefill_pool_to_its_token_demand_at_once(monkeypatch):
    """The settled slo policy started one prefill replica per start-up here (its replicas never reach
    their admission limit); sized on the prompt tokens it starts what the surge needs at once."""
    seen = _record(monkeypatch, SLOFeedback)
    rc, (_, result, _) = _run(PREFILL_BOUND, "slo")
    assert result.decode.events == []
    ups = _ups(result.prefill)
    first_time, first = ups[0]
    assert 10 < first_time <= 14
    # what the prompt tokens need, from the pool's own step prices at the surge's rate and mean prompt
    from sim import build_sim_executor

    executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler)
    info = executor.info()
    rate = replica_limits(executor.cost_model.step_time, rc.scheduler, info.num_blocks, info.block_size).tokens_per_s
    assert rate is not None
    needed = math.ceil(300 * 3501 / rate(3500))
    assert needed >= 3 and 1 + first >= needed, (needed, ups)
    # the pools read their own demand: the prefill pool its arrivals' prompts, one output token, a token rate
    prefill = [s for s in seen if s.limits is not None and s.limits.tokens_per_s is not None and s.now == first_time]
    assert prefill and 250 <= prefill[0].arrival_rate <= 350 and 3000 <= prefill[0].prompt_tokens <= 4000
    assert prefill[0].output_tokens == 1


def test_a_decode_bound_surge_grows_the_decode_pool_to_its_concurrency_demand_at_once(monkeypatch):
    """Sized on the requests in service before the demand was measured, utilisation started one
    decode replica, then 4 more a start-up later; on the decode demand, what it needs at once."""
    seen = _record(monkeypatch, Utilisation)
    _, (outcome, result, _) = _run(DECODE_BOUND, "utilisation")
    assert result.prefill.events == []
    ups = [(t, n) for t, n in _ups(result.decode) if t < 30]
    assert len(ups) == 1 and 10 < ups[0][0] <= 14 and ups[0][1] >= 2, ups
    decode = [s for s in seen if s.limits is not None and s.limits.tokens_per_s is None and s.now == ups[0][0]]
    assert decode, "the decode pool's limits have no token rate: its steps compute a token a request"
    signal = decode[0]
    assert 30 <= signal.arrival_rate <= 50 and 200 <= signal.output_tokens <= 400 and 50 <= signal.prompt_tokens <= 100
    # the decode pool's time in service is its own: from the transfer's start to the finish
    requests = outcome.requests
    on_decode = (requests["finish"] - requests["transfer_start"]).mean()
    assert signal.service_s == pytest.approx(on_decode, rel=0.5)
    assert signal.service_s < (requests["finish"] - requests["arrival"]).mean()
    needed = math.ceil(signal.arrival_rate * signal.service_s / 8 - 1e-9)
    assert 1 + ups[0][1] >= needed >= 2
