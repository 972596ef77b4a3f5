"""Autoscaling: an elastic fleet held at one size is the static fleet, replicas take traffic only once
started, policies scale up after a surge and down after it within their cooldowns, costs integrate
the replicas' lifetimes, and bad input fails in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.elastic import ColdStart
from harness.autoscale.config import SLO, AutoscaleConfig, build_autoscale
from harness.autoscale.run import lifetimes_frame, run_autoscaled
from harness.config import build_run_config
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig, build_fleet
from harness.fleet.run import run_fleet_once
from harness.study import run_study
from harness.workloads.build import build_workload
from harness.workloads.config import WorkloadConfig
from tests.harness.conftest import compose_config

SMALL = ["workload.prompt_len.high=300", "workload.output_len.high=100"]
# a replica of 8 sequences: the surge queues on one replica
SURGE = SMALL + ["workload=poisson", "workload.rate_profile=[[0,2],[30,120],[60,2]]", "workload.duration_s=150",
                 "scheduler.max_num_seqs=8"]
# calibration=False: the start-up priced by provision_s, graph_capture_s and the hardware's load bandwidth
FAST = dict(interval_s=2.0, scale_up_cooldown_s=6.0, scale_down_cooldown_s=10.0, provision_s=3.0,
            graph_capture_s=1.0, max_replicas=4, calibration=False)


def _surge(policy: str, **extra):
    cfg = compose_config(SURGE)
    rc = build_run_config(cfg)
    _, router = build_fleet(cfg)
    config = AutoscaleConfig(policy=policy, **{**FAST, **extra})
    slo = SLO(ttft_p90_s=0.5)
    return run_autoscaled(rc, FleetConfig(replicas=1), router, config, slo, progress=False), config


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replicas=st.integers(1, 3), rate=st.sampled_from([5.0, 40.0]), seed=st.integers(0, 3),
       policy=st.sampled_from(["utilisation", "queue", "slo"]))
def test_an_elastic_fleet_held_at_one_size_is_the_static_fleet(replicas, rate, seed, policy):
    cfg = compose_config(SMALL + ["workload=poisson", "workload.num_requests=40", f"workload.rate={rate}",
                                  f"workload.seed={seed}", "router=least_requests"])
    rc = build_run_config(cfg)
    _, router = build_fleet(cfg)
    static = run_fleet_once(rc, FleetConfig(replicas=replicas), router, progress=False)
    held = AutoscaleConfig(policy=policy, min_replicas=replicas, max_replicas=replicas, interval_s=0.5)
    elastic = run_autoscaled(rc, FleetConfig(replicas=replicas), router, held, SLO(ttft_p90_s=0.1), progress=False)
    pd.testing.assert_frame_equal(elastic.fleet.requests, static.requests)
    assert elastic.elastic.events == []


@pytest.mark.parametrize("policy", ["utilisation", "queue", "slo"])
def test_a_surge_scales_up_then_down_within_the_cooldowns(policy):
    outcome, config = _surge(policy, target_running=8.0)
    events = outcome.elastic.events
    ups = [e.time_s for e in events if e.direction == "up"]
    downs = [e.time_s for e in events if e.direction == "down"]
    assert ups and 30.0 <= ups[0] < 60.0, events
    assert downs and max(downs) > 60.0, events
    for before, after in zip(events, events[1:]):
        cooldown = config.scale_up_cooldown_s if after.direction == "up" else config.scale_down_cooldown_s
        assert after.time_s - before.time_s >= cooldown - 1e-9
    served = {life.index for life in outcome.elastic.lifetimes if life.ready_s <= life.stop_s and not life.cancelled}
    assert len(served) <= config.max_replicas + len(downs)


def test_no_replica_takes_traffic_before_its_start_up_has_passed():
    outcome, config = _surge("utilisation", target_running=4.0)
    lifetimes = lifetimes_frame(outcome.elastic).set_index("replica")
    requests = outcome.fleet.requests
    cold = config.provision_s + config.graph_capture_s
    assert (lifetimes["ready_s"] - lifetimes["requested_s"]).iloc[1:].min() >= cold  # weights load on top
    ready = requests["replica"].map(lifetimes["ready_s"])
    assert (requests["arrival"] >= ready).all() and (requests["first_scheduled"] >= ready).all()
    assert requests["replica"].nunique() > 1
    drained = lifetimes.dropna(subset=["drain_s"])
    routed_after = requests.merge(drained, left_on="replica", right_index=True)
    assert (routed_after["arrival"] <= routed_after["drain_s"]).all()  # nothing new once draining


def test_fast_forward_leaves_an_autoscaled_run_unchanged(monkeypatch):
    """The elastic fleet runs replicas only up to its next event (an arrival, an evaluation, a
    replica becoming ready), so decode runs booked at once end where the step-by-step path is."""
    from engine.core import fast_forward_steps

    booked = []

    def counting(self, horizon, land=None):
        before = self.step
        outcome = original(self, horizon, land)
        booked.append(self.step - before)
        return outcome

    original = fast_forward_steps.Booking.segment
    monkeypatch.setattr(fast_forward_steps.Booking, "segment", counting)
    outcomes = {}
    for fast in (True, False):
        cfg = compose_config(SURGE + [f"backend.fast_forward={str(fast).lower()}"])
        config = AutoscaleConfig(policy="utilisation", target_running=4.0, **FAST)
        booked.clear()
        outcomes[fast] = run_autoscaled(build_run_config(cfg), FleetConfig(replicas=1), build_fleet(cfg)[1], config,
                                        SLO(ttft_p90_s=0.5), progress=False)
        assert (sum(booked) > 1000) == fast  # it does book most decode steps at once
    on, off = outcomes[True], outcomes[False]
    assert len(on.elastic.events) >= 2
    assert on.elastic.events == off.elastic.events and on.elastic.lifetimes == off.elastic.lifetimes
    pd.testing.assert_frame_equal(on.fleet.requests, off.fleet.requests)
    pd.testing.assert_frame_equal(on.fleet.steps, off.fleet.steps)
    pd.testing.assert_frame_equal(on.timeline, off.timeline)


def test_cost_integrates_replica_lifetimes():
    outcome, _ = _surge("queue")
    lifetimes = lifetimes_frame(outcome.elastic)
    row = outcome.summary.to_row()
    billed = (lifetimes["stop_s"] - lifetimes["requested_s"]).sum()
    assert row["gpu_hours"] == pytest.approx(billed / 3600.0)
    assert row["cost"] == pytest.approx(row["gpu_hours"] * 3.00)  # conf/hardware/h100.yaml's price
    assert (lifetimes["stop_s"] <= outcome.elastic.fleet.makespan_s + 1e-9).all()
    cfg = compose_config(SURGE)
    static = run_autoscaled(build_run_config(cfg), FleetConfig(replicas=3), build_fleet(cfg)[1],
                            AutoscaleConfig(), SLO(), progress=False, cold_start=ColdStart())
    end = static.elastic.fleet.makespan_s
    assert static.summary.to_row()["gpu_hours"] == pytest.approx(3 * end / 3600.0)
    timeline = static.timeline
    assert timeline["serving"].to_numpy() == pytest.approx(3.0) and timeline["starting"].eq(0).all()


def test_a_rate_profile_draws_its_rates_deterministically():
    cfg = WorkloadConfig(arrival="poisson", rate_profile=((0, 5), (100, 50), (200, 0), (300, 10)), rate_period_s=400,
                         duration_s=1200, num_requests=None, seed=3)
    workload = build_workload(cfg, 4096)
    times = workload.source.arrival  # every request's arrival_time, without drawing 20,000 prompts
    assert [r.arrival_time for r in workload.requests[:50]] == list(times[:50])
    assert np.array_equal(times, build_workload(cfg, 4096).source.arrival)
    local = times % 400
    counts = [((local >= lo) & (local < hi)).sum() / 300 for lo, hi in ((0, 100), (100, 200), (200, 300), (300, 400))]
    assert counts[2] == 0 and abs(counts[0] - 5) < 1 and abs(counts[1] - 50) < 3 and abs(counts[3] - 10) < 1.5
    assert np.all(np.diff(np.sort(times)) >= 0) and times.max() < 1200
    gamma = dataclasses.replace(cfg, arrival="gamma", cv=3.0)
    assert len(build_workload(gamma, 4096)) == pytest.approx(len(times), rel=0.2)


@pytest.mark.parametrize("overrides, message", [
    (["autoscale.policy=queue", "autoscale.min_replicas=3", "autoscale.max_replicas=2"],
     r"^autoscale.min_replicas=3 is above autoscale.max_replicas=2$"),
    (["autoscale.policy=slo"], r"^autoscale.policy=slo with autoscale.slo_metric=ttft needs slo.ttft_p90_s"),
    (["autoscale.policy=bogus"], r"^autoscale.policy must be one of \['utilisation', 'queue', 'slo', 'schedule'\]"),
    (["autoscale.policy=queue", "fleet.replicas=9"], r"^fleet.replicas=9 \(the starting count\) must be within"),
    (["workload=poisson", "workload.rate_profile=[[0,5],[-1,2]]"], r"^workload.rate_profile\[1\]: time -1(.0)? is neg"),
    (["workload=poisson", "workload.rate_profile=[[0,5],[600,2],[300,1]]"], r"time 300(.0)? is not after the previous"),
    (["workload=poisson", "workload.rate_profile=[[0,-5],[60,2]]"], r"^workload.rate_profile\[0\]: rate -5(.0)? is"),
    (["workload=poisson", "workload.duration_s=10"], r"^workload.duration_s=10(.0)? is read only with"),
    (["workload=poisson", "workload.rate_profile=[[0,1e12]]", "workload.duration_s=10"],
     r"^workload.rate_profile: about 1e\+13 arrivals over 10 s need about .* GiB .* but this machine has"),
    (["workload=poisson", "workload.rate_profile=[[0,1e-9],[0.0005,0]]", "workload.rate_period_s=0.001",
      "workload.duration_s=1e8"],
     r"^workload.rate_period_s=0.001 repeats the profile's 2 segments 1e\+11 times over 1e\+08 s: more than 1e\+07"),
    (["workload=poisson", "workload.rate_profile=[[0,0.001]]", "workload.duration_s=10"],
     r"^workload.rate_profile gives no arrival over 10 s \(seed 0\): raise its rates or workload.duration_s$"),
    (["autoscale.policy=schedule"], r"^autoscale.policy=schedule needs autoscale.schedule=\[\[time_s, replicas\]"),
    (["autoscale.policy=queue", "autoscale.schedule=[[0,1]]"], r"^autoscale.schedule is read only with autoscale.pol"),
    (["autoscale.policy=schedule", "autoscale.schedule=[[0,1],[60,9]]"], r"^autoscale.schedule\[1\]: replicas 9"),
    (["autoscale.policy=schedule", "autoscale.schedule=[[30,1],[10,2]]"], r"^autoscale.schedule\[1\]: time 10"),
    (["backend=engine", "autoscale.policy=queue"], r"^autoscale.policy=queue: an engine fleet \(backend=engine\) sca"),
    (["autoscale.policy=queue", "autoscale.graph_capture_s=5"], r"^autoscale.graph_capture_s=5.0 is ignored by the "
     r"cold start measured in \S+qwen3-0.6b.cold_start.json; it is read only with autoscale.calibration=false"),
    (["autoscale.policy=queue", "autoscale.provision_s=inf"], r"^autoscale.provision_s must be a finite number >= 0"),
    (["autoscale.policy=queue", "autoscale.interval_s=inf"], r"^autoscale.interval_s must be a finite number > 0"),
    (["autoscale.policy=queue", "autoscale.report_window_s=1e-9"],
     r"^autoscale.report_window_s=1e-09 would cut .* s of the run into .* windows, more than 1000000"),
    (["fleet=disaggregated", "fleet.decode.autoscale={policy: queue, max_replicas: 2}",
      "autoscale.report_window_s=1e-9"], r"^autoscale.report_window_s=1e-09 would cut .* s of the run"),
    (["fleet=disaggregated", "fleet.decode.autoscale={policy: queue, max_replicas: 2, report_window_s: 30}"],
     r"^fleet.decode.autoscale.report_window_s: timeline.csv's windows are the fleet's: set autoscale.report_window_s"),
])
def test_bad_autoscale_input_is_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(["output.plots=false", "output.progress=false", *overrides]), tmp_path)
    assert "\n" not in str(error.value)


def test_the_autoscale_section_defaults_to_a_static_fleet():
    autoscale, slo = build_autoscale(compose_config([]))
    assert autoscale.policy is None and not slo.is_set


def test_the_autoscale_experiment_with_nothing_to_serve_is_one_line(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,3000,5\n1,4000,5\n")
    overrides = ["experiment=autoscale", "workload=trace", f"workload.trace_path={path}", "workload.oversize=skip",
                 "scheduler.max_model_len=2048", "slo.ttft_p90_s=2", "output.plots=false", "output.progress=false"]
    with pytest.raises(ConfigError, match=r"^static x 1: nothing was served: the workload has no request left"):
        run_study(compose_config(overrides), tmp_path / "out")
