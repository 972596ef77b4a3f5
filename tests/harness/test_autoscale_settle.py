"""Settling (autoscale.settle, engine.core.elastic_states.Scaling.settle): one surge starts the
replicas it needs, not one more per evaluation while they start. Without it, the slo policy asks
again at every evaluation until its first new replica serves (its evidence cannot show capacity
that does not serve yet) and the fleet runs to max_replicas."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.run import run_autoscaled
from harness.config import build_run_config
from harness.fleet.config import FleetConfig, build_fleet
from tests.harness.conftest import compose_config

# one replica of 8 sequences holds about 40 req/s of these; two or three hold 80 (TTFT P90 < 0.1 s)
SMALL = ["workload.prompt_len.high=300", "workload.output_len.high=100", "scheduler.max_num_seqs=8",
         "router=least_requests", "workload=poisson"]
# a start-up of 31 s and more (weights at the hardware's bandwidth on top) against evaluations every 5 s
SLOW_START = dict(interval_s=5.0, scale_up_cooldown_s=0.0, scale_down_cooldown_s=1000.0, provision_s=30.0,
                  graph_capture_s=1.0, max_replicas=10, calibration=False, target_running=8.0)


def _run(policy: str, rate: float, duration: float, settle: bool, seed: int = 0):
    cfg = compose_config(SMALL + [f"workload.rate_profile=[[0,2],[20,{rate}]]", f"workload.duration_s={duration}",
                                  f"workload.seed={seed}"])
    config = AutoscaleConfig(policy=policy, settle=settle, **SLOW_START)
    return run_autoscaled(build_run_config(cfg), FleetConfig(replicas=1), build_fleet(cfg)[1], config,
                          SLO(ttft_p90_s=0.5), progress=False).elastic


def _started_while_starting(elastic) -> list[float]:
    """Scale-ups made while a replica started earlier had not yet begun to serve."""
    return [e.time_s for e in elastic.events if e.direction == "up"
            and any(life.requested_s < e.time_s < life.ready_s and not life.cancelled for life in elastic.lifetimes)]


def test_one_surge_does_not_start_a_replica_per_evaluation():
    # the surge runs 60 s: past the first replicas' start-up, and past each evaluation it overshoots at
    settled, unsettled = _run("slo", 80.0, 80.0, True), _run("slo", 80.0, 80.0, False)
    started = [sum(len(e.replicas) for e in r.events if e.direction == "up") for r in (settled, unsettled)]
    assert started[1] >= 4 and _started_while_starting(unsettled)  # the overshoot, one per evaluation
    assert 1 <= started[0] <= 3 and not _started_while_starting(settled)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["utilisation", "queue", "slo"]), rate=st.sampled_from([40.0, 80.0, 160.0]),
       seed=st.integers(0, 3))
def test_a_steady_surge_starts_no_replica_while_another_is_starting(policy, rate, seed):
    # the surge's rate is read at the first decision and does not grow after: nothing for the rate to
    # add while those replicas start (a surge that grows meanwhile does: test_autoscale_loaded.py)
    elastic = _run(policy, rate, 90.0, True, seed)
    assert not _started_while_starting(elastic)
