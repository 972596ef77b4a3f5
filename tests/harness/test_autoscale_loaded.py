"""Sizing on what a loaded replica serves (harness.autoscale.demand): a full replica's measured
service (ReplicaSignal.served_full) priced for the current mix (ServiceFit); a scale-down that keeps
the replicas the recent arrival rate needs (Demand.floor); with settling, a start while another is
pending only for the arrival rate (policies._bounded)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.core.elastic import FleetSignal, ReplicaSignal, Served
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.demand import ServiceFit
from harness.autoscale.policies import make_policy
from harness.autoscale.run import run_autoscaled
from harness.config import build_run_config
from harness.fleet.config import FleetConfig, build_fleet
from tests.harness.conftest import compose_config
from tests.harness.test_autoscale_drain import _Recorder
from tests.harness.test_autoscale_settle import SLOW_START, SMALL

POLICIES = {"utilisation": AutoscaleConfig(policy="utilisation", target_running=8.0),
            "queue": AutoscaleConfig(policy="queue", target_waiting=4.0),
            "slo": AutoscaleConfig(policy="slo")}
mixes = st.tuples(st.floats(50.0, 20_000.0), st.floats(1.0, 2_000.0))


@settings(max_examples=80, deadline=None)
@given(a=st.one_of(st.just(0.0), st.floats(1e-6, 1e-3)), b=st.one_of(st.just(0.0), st.floats(1e-4, 0.05)),
       samples=st.lists(mixes, min_size=2, max_size=12), mix=mixes)
def test_the_fit_prices_a_full_replica_in_any_mix(a, b, samples, mix):
    """Intervals served at t = a x prompt + b x output a request give back a and b where the mixes
    tell them apart, and so the rate of any other mix; the costs are never negative."""
    assume(a > 0 or b > 0)
    fit = ServiceFit()
    for prompt, output in samples:
        fit.add(Served(1.0 / (a * prompt + b * output), prompt, output))
    costs = fit.coefficients()
    assert costs is not None and min(costs) >= 0
    ratios = [p / o for p, o in samples]
    if max(ratios) > 1.5 * min(ratios):
        rate = fit.rate(*mix)
        assert rate is not None and math.isclose(rate, 1.0 / (a * mix[0] + b * mix[1]), rel_tol=1e-3)


@settings(max_examples=80, deadline=None)
@given(samples=st.lists(st.tuples(st.floats(0.01, 50.0), st.floats(0.0, 30_000.0), st.floats(0.0, 3_000.0)),
                        min_size=1, max_size=10))
def test_the_fit_never_prices_a_negative_cost(samples):
    fit = ServiceFit()
    for rate, prompt, output in samples:
        fit.add(Served(rate, prompt, output))
    costs = fit.coefficients()
    assert costs is not None and min(costs) >= 0


def test_the_azure_mix_moves_what_a_full_replica_serves():
    # 5-minute spans of two full Qwen3-32B replicas on the Azure trace (experiments: the study's
    # static fleet of 2): 2.0-3.4 req/s as the mean output moved, priced within 15% from the fit
    spans = [(2.4, 1076, 253), (2.0, 1222, 289), (2.3, 1231, 236), (2.5, 1294, 226), (2.8, 1439, 172),
             (3.2, 1263, 137), (3.4, 860, 142), (2.4, 973, 249)]
    fit = ServiceFit()
    for rate, prompt, output in spans:
        fit.add(Served(rate, prompt, output))
    errors = [fit.rate(p, o) / rate - 1 for rate, p, o in spans]  # type: ignore[operator]
    assert max(abs(e) for e in errors) < 0.15, errors
    assert np.ptp([rate for rate, _, _ in spans]) > 1.0  # a mean over them would be off by up to 30%


def _signal(now: float, rate: float, serving: int, ttft_s: float, starting: int = 0, settle: bool = True,
            served: float | None = 2.3, startup_s: float = 89.0) -> FleetSignal:
    """Replicas of 8 sequences holding nothing queued, each full one having served `served` req/s."""
    full = served is not None
    loads = tuple(ReplicaSignal(8, 0, 0.9, 0, full, served_full=Served(served, 1000.0, 200.0) if full else None)
                  for _ in range(serving))
    return FleetSignal(now, loads, starting, 0, (ttft_s,) * 20, (), (), rate, 3.0, startup_s, 1000.0, 200.0,
                       interval_s=15.0, settle=settle, scale_up_cooldown_s=60.0)


def test_a_scale_down_keeps_what_the_rate_needs():
    # three replicas at 5.35 req/s, each full one measured at 2.3 req/s: two serve 4.6, so a P90 of
    # 0.2 s (below 0.4 x the 2 s SLO) drains none; the Azure Qwen3-32B fleet drained to two there,
    # on a capacity of 3.8 req/s from the fleet's time in service, mostly served below the limit
    policy = make_policy(AutoscaleConfig(policy="slo"), SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(855.0, 5.35, 3, 0.2)) == 3
    assert policy.desired(_signal(870.0, 4.0, 3, 0.2)) == 3  # 5.35 was read within a return's time
    assert policy.desired(_signal(870.0 + 60 + 15 + 89, 4.0, 3, 0.2)) == 2  # ... and has left it
    # no replica measured full: the modelled capacity is no floor (it overstated a loaded replica 2x)
    unmeasured = make_policy(AutoscaleConfig(policy="slo"), SLO(ttft_p90_s=2.0))
    assert unmeasured.desired(_signal(855.0, 5.35, 3, 0.2, served=None)) == 2


@settings(max_examples=60, deadline=None)
@given(rates=st.lists(st.floats(0.1, 20.0), min_size=1, max_size=12), serving=st.integers(1, 8),
       policy=st.sampled_from(sorted(POLICIES)), ttft_s=st.floats(0.01, 0.5))
def test_no_scale_down_below_the_recent_peak(rates, serving, policy, ttft_s):
    """Fed evaluations 15 s apart, no policy asks for fewer replicas than serve the highest rate of
    the last return time (a cooldown, an interval and a start-up: 164 s) at the measured 2.3 req/s."""
    made = make_policy(POLICIES[policy], SLO(ttft_p90_s=2.0))
    for k, rate in enumerate(rates):
        want = made.desired(_signal(15.0 * (k + 1), rate, serving, ttft_s))
        recent = rates[max(0, k - 10):k + 1]  # within 164 s
        if want < serving:
            assert want >= math.ceil(max(recent) / 2.3 - 1e-9), (k, want)


@settings(max_examples=60, deadline=None)
@given(rate=st.floats(0.1, 40.0), serving=st.integers(1, 6), starting=st.integers(1, 4),
       policy=st.sampled_from(sorted(POLICIES)), ttft_s=st.floats(0.01, 30.0))
def test_while_a_start_is_pending_only_the_rate_starts_more(rate, serving, starting, policy, ttft_s):
    """With settling, a policy asks for more than serve and start only as far as the arrival rate
    needs at a replica's capacity; without it, as before."""
    made = make_policy(POLICIES[policy], SLO(ttft_p90_s=2.0))
    want = made.desired(_signal(100.0, rate, serving, ttft_s, starting))
    assert want <= max(serving + starting, math.ceil(rate / 2.3 - 1e-9))


def _surge(settle: bool):
    # 2 req/s, then 60 from 20 s and 160 from 40 s: the first decision (25 s) sizes on 60, and the
    # rate reads 160 while those replicas start (31 s and more)
    cfg = compose_config(SMALL + ["workload.rate_profile=[[0,2],[20,60],[40,160]]", "workload.duration_s=90"])
    config = AutoscaleConfig(policy="utilisation", settle=settle, **SLOW_START)
    return run_autoscaled(build_run_config(cfg), FleetConfig(replicas=1), build_fleet(cfg)[1], config,
                          SLO(ttft_p90_s=0.5), progress=False).elastic


def test_a_surge_that_grows_while_replicas_start_starts_more():
    elastic = _surge(True)
    ups = [(e.time_s, len(e.replicas)) for e in elastic.events if e.direction == "up"]
    first_ready = min(life.ready_s for life in elastic.lifetimes[1:])
    assert len(ups) >= 2 and ups[1][0] < first_ready, ups  # a second start before the first serves
    assert sum(n for _, n in ups) <= 6, ups  # one replica serves about 40 req/s of these


def test_a_full_replica_reports_what_it_served():
    # one replica of 8 sequences at 80 req/s (it serves about 40): full at every evaluation after the
    # first seconds; what it reports is its finishes over the interval
    recorder = _Recorder()
    cfg = compose_config(SMALL + ["workload.rate_profile=[[0,80]]", "workload.duration_s=30"])
    config = AutoscaleConfig(policy="slo", interval_s=5.0, calibration=False, min_replicas=1, max_replicas=1)
    outcome = run_autoscaled(build_run_config(cfg), FleetConfig(replicas=1), build_fleet(cfg)[1], config,
                             SLO(ttft_p90_s=1.0), progress=False, policy=recorder)
    finish = outcome.fleet.requests["finish"].to_numpy()
    reported = 0
    previous = False
    for signal in recorder.signals:
        (load,) = signal.serving
        assert (load.served_full is not None) <= (previous and load.full), signal.now
        if load.served_full is not None:
            done = ((finish > signal.now - 5.0) & (finish <= signal.now)).sum()
            assert load.served_full.rate == done / 5.0, signal.now
            reported += 1
        previous = load.full
    assert reported >= 3
