"""How many replicas a scale-up starts: the utilisation, queue and slo policies size a surge on the
arrival rate against what a full replica serves (and the replicas a queue keeps busy past the
start-up), not on the backlog queued on the serving replicas, which no new replica can take."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.elastic import FleetSignal, ReplicaSignal
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.policies import make_policy
from tests.harness.test_autoscale_settle import _run

POLICIES = {"utilisation": AutoscaleConfig(policy="utilisation", target_running=8.0),
            "queue": AutoscaleConfig(policy="queue", target_waiting=4.0),
            "slo": AutoscaleConfig(policy="slo")}


def _signal(backlogs: list[int], rate: float, service_s: float, startup_s: float, running: int = 8) -> FleetSignal:
    serving = tuple(ReplicaSignal(running, b, 1.0, b, True) for b in backlogs)
    return FleetSignal(100.0, serving, 0, 0, (5.0,) * 10, (), (5.0,) * sum(backlogs), rate, service_s, startup_s)


def test_the_first_scale_up_of_a_surge_starts_what_the_rate_needs():
    # one replica of 8 sequences serves about 48 req/s of these; the surge to 80 needs 2, and the
    # one serving now is kept busy by the backlog it builds over the 31 s start-up: 3 in all.
    # Sized on the backlog (about 190 queued at the first evaluation), utilisation and queue
    # started 9 at once; the settled slo policy started one per start-up.
    for policy in POLICIES:
        elastic = _run(policy, 80.0, 80.0, True)  # 60 s of surge: past the start-up of its first up
        ups = [len(e.replicas) for e in elastic.events if e.direction == "up"]
        assert ups and ups[0] == 2 and sum(ups) <= 3, (policy, ups)


@settings(max_examples=60, deadline=None)
@given(backlogs=st.lists(st.integers(1, 100_000), min_size=1, max_size=6), rate=st.floats(1.0, 500.0),
       service_s=st.floats(0.05, 30.0), startup_s=st.floats(0.0, 900.0), policy=st.sampled_from(sorted(POLICIES)))
def test_a_backlog_adds_at_most_the_replicas_it_holds(backlogs, rate, service_s, startup_s, policy):
    """However long the queues, they add at most one replica per serving replica to what the arrival
    rate needs at a full replica's capacity (8 / service_s); the slo policy asks at least one more."""
    config = POLICIES[policy]
    want = make_policy(config, SLO(ttft_p90_s=2.0)).desired(_signal(backlogs, rate, service_s, startup_s))
    per_replica = config.target_running if policy == "utilisation" else 8.0
    by_rate = math.ceil(rate * service_s / per_replica - 1e-9)
    assert want <= by_rate + len(backlogs) + (policy == "slo")
    # ... and a queue that outlasts the next start-up keeps its replica out of the count
    if min(backlogs) > 2 * startup_s * 8.0 / service_s:
        # (the queue policy holds the serving count while its queue is within target_waiting each)
        assert want >= by_rate + len(backlogs) or policy == "queue" and want == len(backlogs)


def test_a_queue_that_drains_before_the_start_up_ends_adds_nothing():
    # 10 queued at 80 req/s of capacity, arrivals at 20 req/s: drained in well under the 30 s start-up
    signal = _signal([10], 20.0, 0.1, 30.0)
    assert make_policy(POLICIES["utilisation"], SLO()).desired(signal) == 1
