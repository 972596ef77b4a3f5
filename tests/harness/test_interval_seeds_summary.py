"""experiments/fidelity/interval_seeds_summary.py: per table and model-and-load group, the cells a
conformalised interval holds and its median width."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.fidelity.interval_seeds_summary import group_summary, main


def _table(engines: list[float], model: str = "m") -> pd.DataFrame:
    """One group, one class per engine value, every interval [0.9, 1.1]."""
    return pd.DataFrame([{"model": model, "hardware": "h", "workload": f"c{i}", "load": "0.5",
                          "metric": "ttft_p50_s", "engine": engine, "sim": 1.0, "sim_lo": 0.9, "sim_hi": 1.1,
                          "in_interval": 0.9 <= engine <= 1.1, "cost_model": "profiled"}
                         for i, engine in enumerate(engines)])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=10, max_size=30))
def test_a_groups_cells_inside_are_counted_against_their_widened_intervals(engines: list[float]) -> None:
    row = group_summary(_table(engines), None).iloc[0]
    assert row["cells"] == len(engines)
    assert row["propagated"] == pytest.approx(sum(0.9 <= e <= 1.1 for e in engines) / len(engines))
    assert row["inside"] >= round(row["propagated"] * len(engines))  # a margin only widens
    assert row["width_p50"] >= row["width_propagated_p50"] == pytest.approx(math.log(1.1 / 0.9))


def test_a_group_of_too_few_classes_claims_nothing_and_other_models_are_left_out() -> None:
    table = pd.concat([_table([1.0] * 10), _table([1.0] * 3, model="other")])
    summary = group_summary(table, None)
    assert list(summary["model"]) == ["m"] and summary["inside"].iloc[0] == 10


def test_tables_are_labelled_and_a_missing_one_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _table([1.0] * 9 + [1.5]).to_csv(tmp_path / "a.csv", index=False)
    out = tmp_path / "summary.csv"
    assert main([f"s1={tmp_path / 'a.csv'}", f"s2={tmp_path / 'a.csv'}", "--out", str(out)]) == 0
    written = pd.read_csv(out)
    assert list(written["table"]) == ["s1", "s2"] and list(written["inside"]) == [9, 9]
    assert main([f"s3={tmp_path / 'missing.csv'}"]) != 0
    assert "no table" in capsys.readouterr().err


def test_append_keeps_other_models_and_labels_and_replaces_the_same_ones(tmp_path: Path) -> None:
    _table([1.0] * 9 + [1.5]).to_csv(tmp_path / "a.csv", index=False)
    _table([1.0] * 10, model="other").to_csv(tmp_path / "b.csv", index=False)
    out = tmp_path / "summary.csv"
    assert main([f"s1={tmp_path / 'a.csv'}", f"s2={tmp_path / 'a.csv'}", "--out", str(out)]) == 0
    assert main([f"s1={tmp_path / 'b.csv'}", "--model", "other", "--out", str(out), "--append"]) == 0
    assert main([f"s1={tmp_path / 'b.csv'}", "--model", "other", "--out", str(out), "--append"]) == 0
    written = pd.read_csv(out, dtype={"load": str})
    assert list(zip(written["table"], written["model"], written["inside"])) == [
        ("s1", "m", 9), ("s2", "m", 9), ("s1", "other", 10)]
    assert list(written["load"]) == ["0.5"] * 3
    assert main([f"s1={tmp_path / 'b.csv'}", "--model", "other", "--out", str(out)]) == 0
    assert list(pd.read_csv(out)["model"]) == ["other"]  # without --append the file is replaced


def test_append_without_out_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["s1=x.csv", "--append"])
