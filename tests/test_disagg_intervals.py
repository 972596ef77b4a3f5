"""experiments/disagg/intervals.py: a measure call's figures against its cells' prediction intervals,
counted per model, fleet kind and load (the re-simulation itself, resim.py --interval, is read from
its CSV where one is there; harness.fidelity.fleet_interval is tested in tests/harness)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from experiments.disagg import intervals

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


def _call(tmp_path, measured: dict[tuple[str, str], float]):
    """A call folder whose measured cells have every latency at the given value, and its re-simulation:
    points at 1.0, intervals [0.9, 1.3]."""
    call = tmp_path / "disagg" / "call"
    call.mkdir(parents=True)
    (call / "settings.json").write_text(json.dumps({"args": {"model": "qwen3-8b"}}))
    runs, sims = [], []
    for (fleet, load), value in measured.items():
        cell = {"fleet": fleet, "workload": "long", "load": load}
        runs.append({"side": "measured", **cell, **{m: value for m in METRICS}})
        runs.append({"side": "profiled", **cell, **{m: 1.0 for m in METRICS}})
        sims.append({**cell, **{m: 1.0 for m in METRICS}, **{f"{m}_lo": 0.9 for m in METRICS},
                     **{f"{m}_hi": 1.3 for m in METRICS}})
    pd.DataFrame(runs).to_csv(call / "runs.csv.gz", index=False)
    out = tmp_path / "out"
    (out / "resim").mkdir(parents=True)
    pd.DataFrame(sims).to_csv(out / "resim" / "disagg_call.csv", index=False)
    return call, out


def test_figures_are_counted_inside_their_interval_and_within_target_apart(tmp_path, capsys):
    # 1.05: point within 10%, inside; 1.25: point 20% short, inside; 1.5: outside both
    call, out = _call(tmp_path, {("1P1D", "0.5"): 1.05, ("1P1D", "0.8"): 1.25, ("2x", "0.8"): 1.5})
    intervals.main([str(call), "--out", str(out)])
    cells = pd.read_csv(out / "intervals.csv", dtype={"load": str})
    assert len(cells) == 3 * len(intervals.LATENCIES)
    inside = cells.groupby(["fleet", "load"])["inside"].all()
    assert inside.to_dict() == {("1P1D", "0.5"): True, ("1P1D", "0.8"): True, ("2x", "0.8"): False}
    table = pd.read_csv(out / "intervals_summary.csv", dtype={"load": str}).set_index(["model", "kind", "load"])
    assert table.loc[("qwen3-8b", "disaggregated", "0.8"), "point_within_target"] == 0
    assert table.loc[("qwen3-8b", "disaggregated", "0.8"), "inside_interval"] == 4
    assert table.loc[("qwen3-8b", "disaggregated", "0.5"), "point_within_target"] == 4
    assert table.loc[("qwen3-8b", "aggregated", "0.8"), "coverage"] == 0.0
    assert table.loc[("all", "all", "all"), "inside_interval"] == 8
    assert table.loc[("all", "all", "all"), "median_width"] == pytest.approx(0.4)
    assert "wrote" in capsys.readouterr().out


def test_a_folder_that_is_not_a_measure_call_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no settings.json"):
        intervals.main([str(tmp_path), "--out", str(tmp_path / "out")])


def test_the_repeat_table_is_the_second_calls_measured_cells_over_the_firsts(tmp_path, capsys):
    from experiments.disagg.h200_06b_run10 import repeat

    first, second = tmp_path / "first", tmp_path / "second"
    for call, tpot in ((first, 0.010), (second, 0.0096)):
        call.mkdir()
        rows = [{"side": "measured", "fleet": "1P1D", "workload": "long", "load": "0.8", "rate_req_s": 27.0,
                 **{m: 1.0 for m in repeat.METRICS}, "tpot_p50_s": tpot},
                {"side": "profiled", "fleet": "1P1D", "workload": "long", "load": "0.8", "rate_req_s": 27.0,
                 **{m: 9.0 for m in repeat.METRICS}}]
        pd.DataFrame(rows).to_csv(call / "runs.csv.gz", index=False)
    table = repeat.repeat(first, second)
    assert table.loc[("1P1D", "long", "0.8"), "tpot_p50_s"] == -4.0
    assert table.loc[("1P1D", "long", "0.8"), "ttft_p50_s"] == 0.0 and len(table) == 1
    repeat.main([str(first), str(second)])
    assert "-4.0" in capsys.readouterr().out


def test_the_graphs_summary_names_a_call_without_kept_steps_and_writes_nothing(tmp_path):
    from experiments.disagg.h200_06b_graphs8k import summary

    calls = []
    for name in ("a", "b"):
        call = tmp_path / name
        call.mkdir()
        pd.DataFrame([{"side": "measured", "fleet": "1P1D", "workload": "long", "load": "0.5",
                       **{m: 1.0 for m in summary.METRICS}}]).to_csv(call / "runs.csv", index=False)
        calls.append(str(call))
    with pytest.raises(SystemExit, match="no kept steps"):
        summary.main([*calls, "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
