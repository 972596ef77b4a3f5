"""experiments/serve/repeat_runs.py: two runs' serve.csv side by side, each figure's move in percent,
only the rows both have; a folder without serve.csv is one line."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.serve import repeat_runs


def serve(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"workload": "azure", "load": 0.5, "source": source, "ttft_p50_ms": p50, "ttft_p90_ms": p90,
                          "itl_p50_ms": 4.0, "itl_p90_ms": 5.0} for source, p50, p90 in rows])


def test_each_figure_moves_in_percent_for_the_rows_both_runs_have():
    first = serve([("harness_run", 10.0, 20.0), ("engine_server_aiperf", 12.0, 24.0)])
    second = serve([("harness_run", 11.0, 15.0), ("sim_server_aiperf", 1.0, 1.0)])
    table = repeat_runs.moves(first, second)
    assert list(table["source"]) == ["harness_run"]
    assert table.loc[0, ["ttft_p50_pct", "ttft_p90_pct", "itl_p50_pct"]].tolist() == pytest.approx([10.0, -25.0, 0.0])


def test_main_reads_two_committed_runs_and_names_a_folder_without_tables(tmp_path, capsys):
    assert repeat_runs.main(["experiments/serve/h100_run5_aiperf", "experiments/serve/h100_run6_aiperf"]) == 0
    assert "engine_server_aiperf" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no serve.csv"):
        repeat_runs.main([str(tmp_path), "experiments/serve/h100_run6_aiperf"])
