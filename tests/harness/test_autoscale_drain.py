"""The slo policy while its SLO is missed (harness.autoscale.demand.MissSizing): a queue that drains
before a replica started now could serve is no reason to start one; a queue that outlasts the
start-up (modelled, or as measured when it drains slower), a demand the fleet cannot serve, or a
miss without a queue, is; and a P90 under target on less than a window's evidence drains nothing."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core.elastic import ColdStart, FleetSignal, ReplicaSignal, Served
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.demand import drain_s
from harness.autoscale.policies import make_policy
from harness.autoscale.run import run_autoscaled
from harness.config import build_run_config
from harness.fleet.config import FleetConfig, build_fleet
from tests.harness.conftest import compose_config
from tests.harness.test_autoscale_settle import SLOW_START, SMALL, _run

# 8 requests in service at a time, 3 s each: a replica serves 8 / 3 = 2.67 req/s
SERVICE_S, CAPACITY = 3.0, 8 / 3.0
CONFIG = AutoscaleConfig(policy="slo")
# replicas of 8 sequences behind a round-robin router: a queue stays on the replica it built on
SURGE_RR = [o for o in SMALL if not o.startswith("router=")] + ["router=round_robin"]
SMALL_FLEET = [o for o in SURGE_RR if o != "router=round_robin"] + [
    "workload.rate_profile=[[0,10],[30,60]]", "workload.duration_s=90"]


def _signal(now: float, backlogs: list[int], rate: float, ttft_s: float = 5.0, startup_s: float = 600.0,
            routed: list[float] | None = None, ages: tuple[float, ...] = ()) -> FleetSignal:
    """Replicas at their limit holding `backlogs` queued, each sent routed[i] req/s (None: not
    measured); `ages`: how long the requests still waiting for a first token have waited."""
    sent = routed if routed is not None else [None] * len(backlogs)
    serving = tuple(ReplicaSignal(8, b, 1.0, b, True, arrival_rate=r) for b, r in zip(backlogs, sent))
    return FleetSignal(now, serving, 0, 0, (ttft_s,) * 20, (), ages, rate, SERVICE_S, startup_s, interval_s=15.0)


def test_a_surge_backlog_that_drains_before_a_start_up_ends_starts_nothing():
    # four replicas serve 6 req/s (3 needed); one holds 300 queued from the surge, which it drains at
    # 2.67 - 6/4 = 1.17 req/s: 257 s, less than the 600 s start-up. The P90 stays above the 2 s SLO
    # meanwhile, and the fleet holds: a replica started now would serve after the queue is gone.
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    drain = drain_s(_signal(100.0, [300, 0, 0, 0], 6.0), CAPACITY)
    assert abs(drain - 300 / (CAPACITY - 1.5)) < 1e-9
    for step in range(int(drain // 15.0) + 1):
        now = 100.0 + 15.0 * step
        left = max(0, round(300 - (CAPACITY - 1.5) * (now - 100.0)))
        assert policy.desired(_signal(now, [left, 0, 0, 0], 6.0)) == 4, now
    # a miss with the queue gone is no drain's
    assert policy.desired(_signal(100.0 + drain + 1.0, [0, 0, 0, 0], 6.0)) == 5


@pytest.mark.parametrize("startup_s", [30.0, 120.0, 240.0, 270.0, 600.0])
def test_a_queue_that_outlasts_the_start_up_starts_a_replica_at_once(startup_s):
    # the same 257 s drain: a replica started now serves before it ends when the start-up is
    # shorter, and takes a quarter of the arrivals off the replica holding the queue (each one sent
    # there waits behind the 300 and misses), so one more at the first decision; with a longer
    # start-up the queue is gone first, and the fleet holds
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    want = policy.desired(_signal(100.0, [300, 0, 0, 0], 6.0, startup_s=startup_s))
    assert want == (5 if startup_s < 300 / (CAPACITY - 1.5) else 4)


def test_a_queue_that_drains_slower_than_modelled_starts_a_replica():
    # modelled, the 300 drain in 257 s; measured over a window, the queue shrank by 12 in 60 s (0.2
    # req/s: the replica holding it serves less than the fleet's capacity, or the arrivals rose):
    # 1440 s left, longer than the 600 s start-up
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    for now, queue in ((100.0, 300), (115.0, 297), (130.0, 294), (145.0, 291)):
        assert policy.desired(_signal(now, [queue, 0, 0, 0], 6.0)) == 4, now  # watched for less than a window
    assert policy.desired(_signal(160.0, [288, 0, 0, 0], 6.0)) == 5
    # a queue that grew does not drain
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [300, 0, 0, 0], 6.0)) == 4
    assert policy.desired(_signal(160.0, [310, 0, 0, 0], 6.0)) == 5
    # ... and a measured drain shorter than the start-up still holds
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [300, 0, 0, 0], 6.0, startup_s=2000.0)) == 4
    assert policy.desired(_signal(160.0, [288, 0, 0, 0], 6.0, startup_s=2000.0)) == 4


def test_a_queue_read_between_two_evaluations_is_no_trend():
    # a queue of 11 that reads 12 fifteen seconds later (a request more arrived than finished) drains
    # in 22 s at the model: Azure's Qwen3-32B fleet started a fourth replica on that reading (inf)
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    rate = 3 * 1.83
    assert policy.desired(_signal(100.0, [11, 0, 0], rate, startup_s=89.0, routed=[1.83] * 3)) == 3
    assert policy.desired(_signal(115.0, [12, 0, 0], rate, startup_s=89.0, routed=[1.83] * 3)) == 3


def test_a_queue_on_a_replica_sent_nothing_holds():
    # a least-loaded router sends the replica holding the queue nothing: it drains at its capacity
    # (300 / 2.67 = 112 s, longer than a 30 s start-up), and a new replica would take no arrivals
    # off it, so the fleet holds; the same queue on a replica sent its share starts one
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [300, 0, 0, 0], 6.0, startup_s=30.0, routed=[0.0, 2.0, 2.0, 2.0])) == 4
    signal = _signal(100.0, [300, 0, 0, 0], 6.0, startup_s=30.0, routed=[1.5, 1.5, 1.5, 1.5])
    assert abs(drain_s(signal, CAPACITY) - 300 / (CAPACITY - 1.5)) < 1e-9
    assert make_policy(CONFIG, SLO(ttft_p90_s=2.0)).desired(signal) == 5


@settings(max_examples=60, deadline=None)
@given(replicas=st.integers(2, 6), load=st.floats(0.05, 0.5), queue=st.integers(1, 3000),
       steps=st.lists(st.tuples(st.floats(1.0, 60.0), st.integers(-200, 100)), min_size=1, max_size=8),
       startups=st.tuples(st.floats(0.0, 900.0), st.floats(0.0, 900.0)))
def test_a_shorter_start_up_never_starts_fewer(replicas, load, queue, steps, startups):
    """Fed the same evaluations of a fleet that serves its arrivals (at most half its capacity) while
    one replica holds a queue, the rule with the shorter start-up asks for at least as many
    replicas at every decision, and either rule for the fleet it has or one more."""
    short, long = sorted(startups)
    policies = [make_policy(CONFIG, SLO(ttft_p90_s=2.0)) for _ in range(2)]
    now, rate = 100.0, load * replicas * CAPACITY
    for dt, change in [(0.0, 0), *steps]:
        now, queue = now + dt, max(queue + change, 0)
        backlogs = [queue] + [0] * (replicas - 1)
        wants = [p.desired(_signal(now, backlogs, rate, startup_s=s)) for p, s in zip(policies, (short, long))]
        assert wants[0] >= wants[1] and set(wants) <= {replicas, replicas + 1}, (now, queue, wants)


def test_a_met_slo_ends_the_miss():
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [300, 0, 0, 0], 6.0)) == 4
    assert policy.desired(_signal(200.0, [0, 0, 0, 0], 6.0, ttft_s=1.0)) == 4  # met, within the band
    # a new miss starts its own drain: 30 queued drain in 26 s
    assert policy.desired(_signal(500.0, [30, 0, 0, 0], 6.0)) == 4
    assert policy.desired(_signal(515.0, [12, 0, 0, 0], 6.0)) == 4
    assert policy.desired(_signal(530.0, [0, 0, 0, 0], 6.0)) == 5
    # and a miss without a backlog is no drain's: one more at once
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [0, 0, 0, 0], 6.0)) == 5


def _measured(signal: FleetSignal, served: float = CAPACITY) -> FleetSignal:
    """The same fleet, each replica having served `served` req/s while full (a measured capacity)."""
    loads = tuple(dataclasses.replace(r, served_full=Served(served, 1000.0, 200.0)) for r in signal.serving)
    return dataclasses.replace(signal, serving=loads, prompt_tokens=1000.0, output_tokens=200.0)


def test_a_miss_no_request_shows_is_over():
    # 15 s after a third replica began to serve, the window's P90 is of requests that queued behind
    # the older replicas' backlog; with that backlog served, nothing waiting past the target, and
    # three replicas serving the recent rate (6 req/s at a measured 2.67 each), the fleet holds: the
    # Azure Qwen3-32B fleet started a fourth here, which served 4 minutes of rates that three hold
    served = _measured(_signal(180.0, [0, 0, 0], 6.0, startup_s=89.0))
    assert make_policy(CONFIG, SLO(ttft_p90_s=2.0)).desired(served) == 3
    # ... not while a request still waits past the target (a long prompt's own prefill), nor on a
    # modelled capacity, nor where the recent rate needs more than the fleet: then the miss is the
    # fleet's recent shortage (the Azure trace at 4x on Qwen3-8B: one replica at 93% of what it
    # serves, then a surge)
    waiting = dataclasses.replace(served, waiting_ages=(0.5, 3.0))
    assert make_policy(CONFIG, SLO(ttft_p90_s=2.0)).desired(waiting) == 4
    modelled = _signal(180.0, [0, 0, 0], 6.0, startup_s=89.0)
    assert make_policy(CONFIG, SLO(ttft_p90_s=2.0)).desired(modelled) == 4
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_measured(_signal(100.0, [0, 0, 0], 8.5, ttft_s=0.5, startup_s=89.0))) == 3  # met
    assert policy.desired(served) == 4  # 8.5 req/s 80 s ago needs 4 at 2.67


def test_a_sustained_overload_still_scales():
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    # 12 req/s needs 4.5 replicas' capacity, and each queue (300, growing by 0.33 req/s) keeps its
    # replica busy for 500 / 2.67 = 187.5 s of the 600 s start-up: 4.5 + 4 x 0.31 -> 6, at once
    assert policy.desired(_signal(100.0, [300, 300, 300, 300], 12.0)) == 6
    # at exactly the fleet's capacity a queue never drains: one more at once
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [50, 0, 0, 0], 4 * CAPACITY, startup_s=0.0)) == 5


def test_a_sustained_surge_in_the_fleet_starts_what_it_needs():
    # 160 req/s for 60 s (past the start-up of the replicas it starts at 25 s) against replicas of
    # about 40 req/s each: the slo policy scales to at least 4
    elastic = _run("slo", 160.0, 80.0, True)
    assert sum(len(e.replicas) for e in elastic.events if e.direction == "up") >= 3


class _Recorder:
    """A policy that keeps its count and records what it sees."""

    def __init__(self) -> None:
        self.signals: list[FleetSignal] = []

    def desired(self, signal: FleetSignal) -> int:
        self.signals.append(signal)
        return len(signal.serving) + signal.starting


@pytest.mark.parametrize("router", ["round_robin", "least_requests"])
def test_each_replica_reports_the_arrivals_routed_to_it(router):
    # the fleet's arrival rate and each replica's are counted over the same span: they add up, and
    # round robin sends each of two replicas half
    recorder = _Recorder()
    cfg = compose_config(SMALL_FLEET + [f"router={router}"])
    config = AutoscaleConfig(policy="slo", interval_s=5.0, calibration=False)
    run_autoscaled(build_run_config(cfg), FleetConfig(replicas=2), build_fleet(cfg)[1], config,
                   SLO(ttft_p90_s=1.0), progress=False, policy=recorder)
    assert len(recorder.signals) > 5
    for signal in recorder.signals:
        rates = [r.arrival_rate for r in signal.serving]
        assert signal.arrival_rate is not None and None not in rates
        assert abs(sum(rates) - signal.arrival_rate) < 1e-9, signal.now
        if router == "round_robin":
            span = 5.0 if any(r.full or r.budget_bound for r in signal.serving) else min(signal.now, 60.0)
            assert abs(rates[0] - rates[1]) <= 1.0 / span + 1e-9, signal.now


def _attainment_by_start_up(seed: int, startups: tuple[float, ...], profile: str,
                            duration_s: float = 150.0) -> list[float]:
    cfg = compose_config(SURGE_RR + [f"workload.rate_profile={profile}", f"workload.duration_s={duration_s}",
                                     f"workload.seed={seed}"])
    rc, router = build_run_config(cfg), build_fleet(cfg)[1]
    config = AutoscaleConfig(policy="slo", **SLOW_START)
    return [run_autoscaled(rc, FleetConfig(replicas=1), router, config, SLO(ttft_p90_s=0.5), progress=False,
                           cold_start=ColdStart(provision_s=s)).summary.to_row()["slo_attainment"]
            for s in startups]


def test_a_shorter_start_up_loses_no_attainment():
    # a surge to 5x one replica's rate on a round-robin fleet: the queue the first replica builds
    # while others start stays on it, and the rule decides each start after the first
    # 40 s past the surge: with the slowest start-up, the replicas started at 25 s serve from 85 s
    attained = _attainment_by_start_up(0, (0.0, 15.0, 60.0), "[[0,20],[20,100],[60,30]]", duration_s=100.0)
    assert attained == sorted(attained, reverse=True) and attained[0] > attained[-1] + 0.3, attained


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 5), profile=st.sampled_from(["[[0,20],[20,100],[60,30]]",
                                                        "[[0,10],[20,60],[50,20],[80,70],[110,20]]"]))
def test_attainment_never_rises_with_the_start_up(seed, profile):
    attained = _attainment_by_start_up(seed, (0.0, 5.0, 15.0, 30.0, 60.0), profile)
    assert attained == sorted(attained, reverse=True), attained


def test_one_fewer_only_on_a_window_of_evidence():
    # a P90 of 0.1 s is below the scale-down threshold (0.4 x 2 s); on the first 15 s of a run, or
    # the few requests since a start began to serve, it is no reason to drain a replica that takes
    # a start-up to get back: the Azure Qwen3-32B fleet drained one of its 2 at t = 15 s and
    # served 10 minutes alone when starts took 10
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    quiet = _signal(15.0, [0, 0], 2.0, ttft_s=0.1)
    assert policy.desired(dataclasses.replace(quiet, evidence_s=15.0)) == 2
    assert policy.desired(dataclasses.replace(quiet, evidence_s=CONFIG.window_s)) == 1
    # a miss on the same little evidence still scales up
    assert policy.desired(dataclasses.replace(_signal(15.0, [0, 0], 2.0, ages=(3.0,)), evidence_s=15.0)) == 3


class _Scripted(_Recorder):
    """Asks for one more replica from t = 10 s, recording what it sees."""

    def desired(self, signal: FleetSignal) -> int:
        super().desired(signal)
        return 2 if signal.now >= 10.0 else 1


@pytest.mark.parametrize("settle", [True, False])
def test_the_evidence_restarts_when_a_start_serves(settle):
    policy = _Scripted()
    cfg = compose_config(SMALL_FLEET)
    config = AutoscaleConfig(policy="slo", interval_s=5.0, provision_s=20.0, graph_capture_s=0.0,
                             calibration=False, settle=settle)
    elastic = run_autoscaled(build_run_config(cfg), FleetConfig(replicas=1), build_fleet(cfg)[1], config,
                             SLO(ttft_p90_s=1.0), progress=False, policy=policy).elastic
    ready = elastic.lifetimes[1].ready_s
    assert 30.0 < ready < 40.0  # 20 s of provisioning and the 0.6B's weights
    for signal in policy.signals:
        began = ready if settle and signal.now >= ready else 0.0
        assert signal.evidence_s == pytest.approx(signal.now - began), signal.now
