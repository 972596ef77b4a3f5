"""StepLog: records and booked runs (StepRun) read as one StepRecord per step, whatever mix of
the two it holds (tests/harness/test_step_table.py: the step table built from it is theirs)."""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engine.core.plan import StepStats
from engine.core.step_log import StepLog, StepRecord, StepRun, first_step_end


def _stats(draw, step: int) -> StepStats:
    ints = st.integers(0, 1000)
    return StepStats(step, draw(st.sampled_from(("prefill", "decode", "mixed"))), *(draw(ints) for _ in range(10)))


@st.composite
def logs(draw):
    log, step, t = StepLog(), 0, 0.0
    for _ in range(draw(st.integers(0, 12))):
        if draw(st.booleans()):
            duration = draw(st.floats(1e-4, 1.0))
            log.append(StepRecord(t, duration, _stats(draw, step), draw(st.none() | st.floats(0, 1))))
            step, t = step + 1, t + duration
        else:
            k = draw(st.integers(1, 6))
            durations = np.array([draw(st.floats(1e-4, 1.0)) for _ in range(k)])
            starts = t + np.concatenate(([0.0], np.cumsum(durations)[:-1]))
            frees = [draw(st.integers(0, 500)) for _ in range(k)]
            log.add_run(StepRun(_stats(draw, step), array("d", starts), array("d", durations), array("q", frees)))
            step, t = step + k, float(starts[-1] + durations[-1])
    return log


@given(logs())
def test_a_log_reads_as_one_record_per_step(log):
    records = list(log)
    assert len(log) == len(records) == sum(r.num_steps if isinstance(r, StepRun) else 1 for r in log.items)
    assert [r.stats.step for r in records] == list(range(len(records)))
    assert log == records and log[-1:] == records[-1:] and bool(log) == bool(records)
    copy = StepLog()
    copy.extend(log.items)
    assert copy == log and copy.num_runs == log.num_runs


def test_a_run_hands_a_hook_the_end_of_its_first_step():
    stats = StepStats(4, "decode", 2, 0, 2, 0, 2, 10, 0, 0)
    run = StepRun(stats, array("d", [1.0, 1.5]), array("d", [0.5, 0.25]), array("q", [10, 9]))
    assert first_step_end(run) == 1.5 and run.end_s == 1.75
    assert first_step_end(StepRecord(1.0, 0.5, stats)) == 1.5
    assert [r.stats.num_free_blocks for r in run.records()] == [10, 9]
