"""experiments/disagg/decode_stalls.py: a decode replica's steps that stall, counted from kept steps."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.disagg import decode_stalls
from experiments.disagg.kept_steps import KEPT_COLUMNS


def _steps(path, stall_s: float, stall_launch_s: float) -> None:
    rows = []
    for side in ("measured", "profiled"):
        # one prefill replica: two 0.3 s steps back to back; one decode replica: 100 steps of 6 ms
        for i in range(2):
            rows.append({"side": side, "pool": "prefill", "replica": 0, "step": i, "start": 0.3 * i, "duration": 0.3,
                         "kind": "prefill", "launch_s": 0.01})
        for i in range(100):
            rows.append({"side": side, "pool": "decode", "replica": 0, "step": i, "start": 0.1 + 0.006 * i,
                         "duration": 0.006, "kind": "decode", "launch_s": 0.001})
    table = pd.DataFrame(rows)
    stalled = (table.side == "measured") & (table.kind == "decode") & (table.step == 50)  # starts at 0.4 s
    table.loc[stalled, ["duration", "launch_s"]] = stall_s, stall_launch_s
    for column in KEPT_COLUMNS:
        if column not in table:
            table[column] = 0
    table.to_csv(path, index=False, compression="gzip")


def test_a_stalled_decode_step_is_counted_with_the_host_share_and_the_prefill_steps_running(tmp_path):
    path = tmp_path / "steps_1P1D_long_offline.csv.gz"
    _steps(path, stall_s=0.5, stall_launch_s=0.25)
    out = tmp_path / "stalls.csv"
    assert decode_stalls.main([str(path), "--out", str(out)]) == 0
    row = pd.read_csv(out).iloc[0]
    assert (row.cell, row.replica, row.decode_steps, row.stalls) == ("1P1D long offline", 0, 100, 1)
    assert row.stall_s == pytest.approx(0.5) and row.stall_host_share == pytest.approx(0.5)
    assert row.stall_share == pytest.approx(0.5 / (0.5 + 99 * 0.006))
    assert row.step_measured_without_s == pytest.approx(0.006) and row.step_sim_s == pytest.approx(0.006)
    assert str(row.prefill_steps_running) == "1"  # the second prefill step (0.3-0.6 s) was running at 0.4 s
    # under the threshold it is no stall
    assert decode_stalls.main([str(path), "--min-s", "0.6", "--out", str(out)]) == 0
    assert pd.read_csv(out).iloc[0].stalls == 0


def test_bad_input_is_refused_in_one_line(tmp_path, capsys):
    assert decode_stalls.main([str(tmp_path / "steps_1P1D_long_0.8.csv.gz")]) == 2
    assert "no such file" in capsys.readouterr().err
    path = tmp_path / "steps_1P1D_long_0.8.csv.gz"
    pd.DataFrame({"a": [1]}).to_csv(path, index=False, compression="gzip")
    assert decode_stalls.main([str(path)]) == 2
    assert "not a kept steps file" in capsys.readouterr().err
