"""Weighing one H200 fit against another: h200_fit_choice.py counts each comparison's cells within
target per fit from the files h200_fit_choice.sh writes, and the disaggregated re-simulation
prices both fleets with the profile it is given."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.disagg.h200_run1 import resim
from experiments.fidelity import h200_fit_choice as choice

REPO = Path(__file__).resolve().parents[1]


def heldout_rows(errors: dict[tuple[str, str], float], cost_model: str = "profiled") -> list[dict]:
    return [{"model": "qwen3-0.6b", "hardware": "H200-SXM-141GB", "workload": "bursty", "load": load,
             "metric": metric, "err": err, "cost_model": cost_model} for (load, metric), err in errors.items()]


def write_fit(folder: Path, heldout_err: float, fleet_within: list[bool], windows: tuple[int, int],
              disagg: tuple[int, int]) -> None:
    (folder / "heldout_h200").mkdir(parents=True)
    errors = {(load, m): heldout_err for load in ("0.5", "0.8", "0.95", "offline")
              for m in ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")}
    errors[("0.5", "ttft_p50_s")] = 0.02  # within either way
    rows = heldout_rows(errors) + heldout_rows({("0.5", "ttft_p90_s"): 0.0}, "roofline")  # not counted
    pd.DataFrame(rows).to_csv(folder / "heldout_h200" / "heldout.csv", index=False)
    (folder / "fleet").mkdir()
    pd.DataFrame({"case": "poisson", "metric": "ttft_p50_s", "within_10pct": fleet_within}).to_csv(
        folder / "fleet" / "fleet_compare.csv", index=False)
    for run in (1, 2, 3):
        (folder / "midrun" / f"run{run}").mkdir(parents=True)
        pd.DataFrame({"pricing": ["as_run"], "windows_within_15pct": [windows[0]], "windows_scored": [windows[1]]}
                     ).to_csv(folder / "midrun" / f"run{run}" / "midrun_rerun.csv", index=False)
    (folder / "disagg").mkdir()
    (folder / "disagg" / "h200_run1.log").write_text(f"1P1D long 0.8 ...\n{disagg[0]} of {disagg[1]} comparisons "
                                                     "within target (ttft_p50_s, ...)\n")


def test_each_comparison_is_counted_per_fit_and_a_comparison_one_fit_lacks_is_empty(tmp_path, capsys):
    write_fit(tmp_path / "old", 0.05, [True, True, False], (9, 12), (55, 78))
    write_fit(tmp_path / "new", 0.12, [True, False, False], (12, 12), (46, 78))
    pd.DataFrame(heldout_rows({("0.5", "tpot_p50_s"): 0.01, ("0.8", "tpot_p50_s"): -0.3})).to_csv(
        tmp_path / "new" / "cc2_run_host.csv", index=False)
    assert choice.main([str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "h200_fit_choice.csv").set_index("comparison")
    heldout = table.iloc[0]
    assert (heldout.cells, heldout.within_old, heldout.within_new) == (8, 8, 1)  # 50 and 80% only
    run_host = table.loc["code_completion H200, second call, each run's measured host"]
    assert pd.isna(run_host.within_old) and (run_host.cells, run_host.within_new) == (2, 1)
    fleet = table.loc["two-replica fleet (fleet/h200x2_run2)"]
    assert (fleet.cells, fleet.within_old, fleet.within_new) == (3, 2, 1)
    assert tuple(table.loc["mid-run start, autoscale/h200_run3", ["within_old", "within_new"]]) == (9, 12)
    disagg = table.loc["disaggregated, h200_run1"]
    assert (disagg.cells, disagg.within_old, disagg.within_new) == (78, 55, 46)
    assert "| disaggregated, h200_run1" in capsys.readouterr().out


def test_a_scratch_folder_without_both_fits_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    assert choice.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_an_unfinished_disagg_log_is_named(tmp_path):
    (tmp_path / "h200_run1.log").write_text("1P1D long 0.8 ...\n")
    with pytest.raises(ValueError, match="h200_run1.log"):
        choice.disagg_comparisons(tmp_path / "h200_run1.log")


class Priced(Exception):
    """Stops resim at its first cell, carrying the profile it priced with."""


OTHER = "experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile_model.csv"


@pytest.mark.parametrize("argv, profile", [([], resim.PROFILE), (["--profile", OTHER], OTHER)])
def test_resim_prices_both_fleets_with_the_profile_given(argv, profile, monkeypatch):
    def first_cell(setup, *args, **kwargs):
        raise Priced(setup.profile)

    monkeypatch.setattr(resim, "simulate", first_cell)
    with pytest.raises(Priced) as priced:
        resim.main(["--run", str(REPO / "experiments" / "disagg" / "h200_run1"), "--aggregated", *argv])
    assert priced.value.args == (profile,)


def test_resim_prices_an_unshipped_model_with_its_h100_profile_carried_as_the_call_did(monkeypatch):
    def first_cell(setup, *args, **kwargs):
        raise Priced(setup.model, setup.profile)

    monkeypatch.setattr(resim, "simulate", first_cell)
    with pytest.raises(Priced) as priced:
        resim.main(["--run", str(REPO / "experiments" / "disagg" / "h200_8b_run1")])
    model, profile = priced.value.args
    assert model == "qwen3-8b" and Path(profile).name == "qwen3-8b_h200_from_h100.csv"
    committed = REPO / "experiments" / "disagg" / "h200_goodput_8b" / "qwen3-8b_h200_from_h100.csv"
    ours, call = pd.read_csv(profile), pd.read_csv(committed)  # the call's own carried fit, to the last bits
    pd.testing.assert_frame_equal(ours, call, rtol=1e-12)
