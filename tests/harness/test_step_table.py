"""The step table (harness.output.metrics.steps_frame) of a StepLog that holds runs of steps
booked at once (StepRun) is the table of its records, one row per step, value for value."""

from __future__ import annotations

import pandas as pd
from hypothesis import given, settings

from engine.core.loop import RunResult
from engine.core.step_log import StepLog
from harness.output.metrics import STEP_COLUMNS, steps_frame
from tests.core.test_step_log import logs


@settings(max_examples=80, deadline=None)
@given(logs())
def test_the_step_table_of_runs_is_the_table_of_their_records(log):
    records = StepLog(list(log))  # the same steps, a record each
    assert records.num_runs == 0
    expected = steps_frame(RunResult(requests=[], steps=records))
    got = steps_frame(RunResult(requests=[], steps=log))
    pd.testing.assert_frame_equal(got, expected, check_exact=True)
    for columns in (("kind", "start"), ("free_blocks", "step"), STEP_COLUMNS[:3]):
        pd.testing.assert_frame_equal(steps_frame(RunResult(requests=[], steps=log), columns), expected[list(columns)])
