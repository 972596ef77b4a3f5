"""Bursty arrivals: a step launched while no other is in flight (the queue ran dry, or every
runnable request waited on the step before) has nothing to hide its launches behind, so an
overlap-priced profiled model charges its whole launch time; with a step in flight it does not."""

from __future__ import annotations

import pytest

from engine.core.executor import BackendInfo
from sim.executor import SimExecutor
from sim.features import step_features
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.test_profiled import GRAPH, true_time
from tests.sim.test_profiled_overlap import LAUNCH_PREFILL, at_step, overlapping_profile


@pytest.fixture()
def executor():
    model = ProfiledCostModel.fit(overlapping_profile(), GRAPH)
    return SimExecutor(model, BackendInfo(1000, 16, 1000, overlaps_steps=True))


def test_a_prefill_submitted_behind_a_step_in_flight_hides_part_of_its_launches(executor):
    decode = executor.submit(at_step(decode_batch([1000] * 50), 1))
    small = executor.submit(at_step(plan(prefill(300)), 2))  # queued while the decode runs
    decode.result()
    gpu = true_time(step_features(plan(prefill(300)), GRAPH))
    assert gpu < small.result().duration_s < 0.9 * LAUNCH_PREFILL


def test_the_first_step_after_the_queue_ran_dry_pays_its_whole_launch(executor):
    executor.submit(at_step(decode_batch([1000] * 50), 1)).result()  # read: nothing in flight now
    small = executor.submit(at_step(plan(prefill(300)), 2))
    assert small.result().duration_s == pytest.approx(LAUNCH_PREFILL, rel=0.02)


def test_steps_run_one_at_a_time_never_overlap(executor):
    executor.execute(at_step(decode_batch([1000] * 50), 1))
    assert executor.execute(at_step(plan(prefill(300)), 2)).duration_s == pytest.approx(LAUNCH_PREFILL, rel=0.02)
