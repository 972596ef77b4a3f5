"""The slo policy while its SLO is missed (harness.autoscale.demand.MissSizing): a backlog that
drains on the replicas the fleet has is no reason to start more; a demand the fleet cannot serve,
or a miss that outlasts the backlog's drain, still is."""

from __future__ import annotations

from engine.core.elastic import FleetSignal, ReplicaSignal
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.demand import drain_s
from harness.autoscale.policies import make_policy
from tests.harness.test_autoscale_settle import _run

# 8 requests in service at a time, 3 s each: a replica serves 8 / 3 = 2.67 req/s
SERVICE_S, CAPACITY = 3.0, 8 / 3.0
CONFIG = AutoscaleConfig(policy="slo")


def _signal(now: float, backlogs: list[int], rate: float, ttft_s: float = 5.0, startup_s: float = 600.0) -> FleetSignal:
    serving = tuple(ReplicaSignal(8, b, 1.0, b, True) for b in backlogs)
    return FleetSignal(now, serving, 0, 0, (ttft_s,) * 20, (), (), rate, SERVICE_S, startup_s, interval_s=15.0)


def test_a_surge_backlog_that_drains_on_the_fleet_starts_nothing():
    # four replicas serve 6 req/s (3 needed); one holds 300 queued from the surge, which it drains at
    # 2.67 - 6/4 = 1.17 req/s: 257 s. The P90 stays above the 2 s SLO meanwhile, and the fleet
    # holds; before the rule, each decision asked for one more.
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    drain = drain_s(_signal(100.0, [300, 0, 0, 0], 6.0), CAPACITY)
    assert abs(drain - 300 / (CAPACITY - 1.5)) < 1e-9
    for step in range(int(drain // 15.0) + 1):
        now = 100.0 + 15.0 * step
        left = max(0, round(300 - (CAPACITY - 1.5) * (now - 100.0)))
        assert policy.desired(_signal(now, [left, 0, 0, 0], 6.0)) == 4, now
    # a miss that outlasts the drain is one the measured capacity does not explain
    assert policy.desired(_signal(100.0 + drain + 1.0, [0, 0, 0, 0], 6.0)) == 5


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


def test_a_sustained_overload_still_scales():
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    # 12 req/s needs 4.5 replicas' capacity, and each queue (300, growing by 0.33 req/s) keeps its
    # replica busy for 500 / 2.67 = 187.5 s of the 600 s start-up: 4.5 + 4 x 0.31 -> 6, at once
    assert policy.desired(_signal(100.0, [300, 300, 300, 300], 12.0)) == 6
    # at exactly the fleet's capacity a queue never drains: one more at once
    policy = make_policy(CONFIG, SLO(ttft_p90_s=2.0))
    assert policy.desired(_signal(100.0, [50, 0, 0, 0], 4 * CAPACITY, startup_s=0.0)) == 5


def test_a_sustained_surge_in_the_fleet_starts_what_it_needs():
    # 160 req/s for 100 s against replicas of about 40 req/s each: the slo policy scales to at least 4
    elastic = _run("slo", 160.0, 120.0, True)
    assert sum(len(e.replicas) for e in elastic.events if e.direction == "up") >= 3
