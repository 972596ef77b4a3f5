"""What makes the plan search's evaluations cheaper changes no row: deployments that are the same
simulation (harness.plan.evaluate.simulation_key: one replica, any router) are simulated once and
give the row each would give simulated alone; a simulated fleet that keeps only step totals (what
an evaluation asks for) summarizes as one that keeps every step."""

from __future__ import annotations

import dataclasses
import logging
import pickle
from itertools import product

import pandas as pd
import pytest

from engine.core.routers import ROUTERS, RouterConfig
from harness.fleet.config import FleetConfig
from harness.fleet.run import run_fleet_once
from harness.plan.config import SLOConfig, load_catalogue
from harness.plan.evaluate import PlanBase, evaluate, evaluate_all, expected_work, simulation_key
from harness.plan.row import Deployment, PlanRow
from harness.scripting import compose_run_config

# shared prefixes and a tight cache: prefix hits (prefix_affinity reads them) and preemptions
WORKLOAD = ["experiment=plan", "workload=shared_prefix", "workload.num_requests=80", "workload.rate=30",
            "workload.shared_prefix.fraction=0.5", "cache.num_blocks=40", "output.progress=false"]


@pytest.fixture(scope="module")
def base() -> PlanBase:
    logging.disable(logging.WARNING)  # the workload's clipping notice
    try:
        rc = compose_run_config(WORKLOAD)
    finally:
        logging.disable(logging.NOTSET)
    return PlanBase(rc, load_catalogue(("h100",)), SLOConfig(), RouterConfig())


def _values(row) -> dict:
    return {k: v for k, v in row.as_dict().items() if k not in ("router", "eval_s")}


@pytest.mark.parametrize("policy", ["nano", "mixed"])
def test_one_replica_gives_every_router_the_same_row(base, policy):
    rows = [evaluate(Deployment("h100", 1, 64, 2048, policy, router, 1), base) for router in ROUTERS]
    assert all(r.measures is not None and not r.error for r in rows)
    assert rows[0].measures.num_rejected == 0 and rows[0].measures.ttft_p90_s > 0
    for row in rows[1:]:
        assert _values(row) == _values(rows[0])


def test_evaluate_all_simulates_each_simulation_once_and_keeps_every_row(base):
    one = [Deployment("h100", 1, 64, 2048, "nano", router, 1) for router in ("round_robin", "least_tokens")]
    two = [dataclasses.replace(d, replicas=2) for d in one]
    deployments = [one[0], two[0], one[1], two[1], one[0]]
    simulated = []

    def mapper(fn, items):
        simulated.extend(items)
        return map(fn, items)

    rows = evaluate_all(deployments, base, mapper)
    assert sorted(simulated, key=str) == sorted([one[0], two[0], two[1]], key=str)  # each simulation once
    assert [r.deployment for r in rows] == deployments
    assert [r.eval_s == 0.0 for r in rows] == [False, False, True, False, True]
    for d, row in zip(deployments, rows):
        alone = evaluate(d, base)
        assert row.as_dict() | {"eval_s": 0.0} == alone.as_dict() | {"eval_s": 0.0}


def test_the_key_keeps_apart_what_can_differ():
    d = Deployment("h100", 1, 64, 2048, "nano", "round_robin", 2)
    assert simulation_key(d) != simulation_key(dataclasses.replace(d, router="least_tokens"))
    for field, value in (("hardware", "a100"), ("tp_size", 2), ("max_num_seqs", 32),
                         ("max_num_batched_tokens", 4096), ("policy", "mixed"), ("replicas", 1)):
        assert simulation_key(d) != simulation_key(dataclasses.replace(d, **{field: value}))


@pytest.mark.parametrize("tp_size", [1, 2])  # overlapped steps, then plain ones
def test_a_fleet_that_keeps_only_step_totals_has_the_same_summaries(base, tp_size):
    """What evaluate() asks of run_fleet_once (keep_steps=False: fast-forwarded runs are added to
    the totals at once) against the whole step tables."""
    rc = dataclasses.replace(base.rc, hardware=base.catalogue["h100"])
    kept, totals = (run_fleet_once(rc, FleetConfig(2, tp_size), RouterConfig(name="least_tokens"), progress=False,
                                   keep_steps=keep) for keep in (True, False))
    assert len(kept.steps) > 0 and totals.steps.empty
    for whole, summed in zip([kept.summary, *kept.replica_summaries], [totals.summary, *totals.replica_summaries]):
        assert whole.num_steps > 0 and whole.preemptions > 0 and whole.cached_tokens > 0
        assert summed.to_row() | {"wall_s": 0} == whole.to_row() | {"wall_s": 0}
    pd.testing.assert_frame_equal(totals.requests, kept.requests)


@pytest.mark.parametrize("tp_size", [1, 2])
def test_requests_made_ahead_serve_as_the_requests_built_for_the_run(base, tp_size):
    """Their prompt hashes (prefix hits here) and sampled tokens (preemptions resample) made once:
    the whole tables of a fleet run are those of a run that builds its own."""
    rc = dataclasses.replace(base.rc, hardware=base.catalogue["h100"])
    fleet, router = FleetConfig(2, tp_size), RouterConfig(name="least_tokens")
    ahead, built = (run_fleet_once(rc, fleet, router, progress=False, prepared=prepared)
                    for prepared in (base.prepared, None))
    assert built.summary.preemptions > 0 and built.summary.cached_tokens > 0
    assert ahead.summary.to_row() | {"wall_s": 0} == built.summary.to_row() | {"wall_s": 0}
    pd.testing.assert_frame_equal(ahead.requests, built.requests)
    pd.testing.assert_frame_equal(ahead.steps, built.steps)


def test_requests_made_for_another_workload_are_not_served(base):
    rc = dataclasses.replace(base.rc, hardware=base.catalogue["h100"],
                             workload=dataclasses.replace(base.rc.workload, seed=base.rc.workload.seed + 1))
    fleet, router = FleetConfig(1, 1), RouterConfig(name="round_robin")
    other = run_fleet_once(rc, fleet, router, progress=False, prepared=base.prepared)
    pd.testing.assert_frame_equal(other.requests, run_fleet_once(rc, fleet, router, progress=False).requests)
    same = run_fleet_once(dataclasses.replace(rc, workload=base.rc.workload), fleet, router, progress=False)
    assert not other.requests["prompt_tokens"].equals(same.requests["prompt_tokens"])


def test_a_base_sent_to_another_process_leaves_its_requests_behind(base):
    assert len(base.prepared) == 80
    copy = pickle.loads(pickle.dumps(base))
    assert "prepared" not in copy.__dict__ and copy == base
    assert len(pickle.dumps(base)) < 100_000  # the prepared requests hold every token id


def test_evaluate_all_hands_out_the_longest_simulations_first(base):
    deployments = [Deployment("h100", tp, 64, 2048, policy, router, 2)
                   for tp, policy, router in product((1, 2), ("nano", "mixed"), ("round_robin", "least_tokens"))]
    handed = []

    def mapper(fn, items):
        handed.extend(items)
        return [PlanRow(d, 0.0, 0.0, True, "", 0.0) for d in items]

    rows = evaluate_all(deployments, base, mapper)
    assert [r.deployment for r in rows] == deployments
    work = [expected_work(d) for d in handed]
    assert sorted(handed, key=str) == sorted(deployments, key=str) and work == sorted(work, reverse=True)
    assert work[0] > work[-1]
