"""experiments/autoscale step tools: midrun_steps rebuilds each step's contexts from the request
table and prices both sides' steps as the simulator does (on the simulator's own steps it gives
back their durations; on steps that took 0.9 times as long it says +11.1%); the rerun's per-kind
price variants scale one kind of step and leave the other; bad input stops in one line."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from experiments.autoscale import midrun_dp, midrun_rerun, midrun_steps

SHORT = {"rates": "5,40", "t0": 5.0, "duration": 12.0, "window": 4.0}  # two replicas, the second from 8 s


def _served(folder: Path) -> None:
    """A short simulated mid-run fleet (midrun_dp's settings, the H200 profile) written as a run
    folder's sim/ side, and as an engine/ side whose every step took 0.9 times as long."""
    from engine.core.elastic import ColdStart
    from harness.autoscale.run import run_autoscaled

    args = SimpleNamespace(**{**midrun_rerun.DEFAULTS, **SHORT})
    side = midrun_dp.compose(midrun_dp.fleet_overrides(args, "h200") + ["backend=sim", "backend.cost_model=profiled"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = run_autoscaled(*side, progress=False, cold_start=ColdStart(process_s=3.0))
    steps = outcome.fleet.steps[list(midrun_dp.STEPS_KEPT)]
    for name, scale in (("sim", 1.0), ("engine", 0.9)):
        (folder / name).mkdir(parents=True)
        outcome.fleet.requests.to_csv(folder / name / "requests.csv.gz", index=False)
        steps.assign(duration=scale * steps["duration"]).to_csv(folder / name / "steps.csv.gz", index=False)


@pytest.mark.slow  # two autoscaled runs priced again; the default run keeps the script's other checks
def test_both_sides_steps_are_rebuilt_and_priced_as_the_simulator_prices_them(tmp_path, capsys):
    _served(tmp_path / "run")
    windows = midrun_steps.compare(tmp_path / "run", tmp_path / "out", "h200", SHORT["window"])
    assert "rebuilt batch or tokens differ in 0" in capsys.readouterr().out
    assert set(windows["kind"]) == {"prefill", "decode"} and set(windows["replica"]) == {0, 1}
    sim, engine = windows[windows["side"] == "sim"], windows[windows["side"] == "engine"]
    np.testing.assert_allclose(sim["priced_error"], 0.0, atol=1e-9)
    np.testing.assert_allclose(engine["priced_error"], 1 / 0.9 - 1, rtol=1e-9)
    assert (engine.loc[engine["kind"] == "decode", "context"] > 0).all()
    shapes = pd.read_csv(tmp_path / "out" / "midrun_step_shapes.csv")
    assert shapes.groupby("side")["steps"].sum().tolist() == [len(pd.read_csv(tmp_path / "run" / "sim" /
                                                                              "steps.csv.gz"))] * 2
    assert shapes["shape"].str.match(r"^(prefill graph \d+|prefill eager|decode \d+-\d+)$").all()


def test_the_step_tool_refuses_a_run_without_step_tables(tmp_path):
    with pytest.raises(SystemExit, match="lacks engine/steps.csv.gz"):
        midrun_steps.main(["--run", str(tmp_path), "--out", str(tmp_path / "out")])


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_a_kind_scaled_profile_prices_that_kind_of_step_alone(kind, tmp_path):
    """All requests there at once, so the schedule does not depend on the prices: each step of the
    scaled kind costs 1.5 times its own (graph steps: the H200 profile prices prefills by their
    device time, with no lead), every other step what it did."""
    from experiments.fidelity.price_sensitivity import kind_scaled
    from harness.run import run_once
    from harness.scripting import compose_run_config

    base = ["model=qwen3-0.6b", "hardware=h200", "backend=sim", "backend.cost_model=profiled", "workload=bench",
            "workload.num_requests=40", "scheduler.max_num_seqs=16"]
    shipped = run_once(compose_run_config(base), progress=False).steps
    profile = kind_scaled(Path("profiles/h200/qwen3-0.6b.csv"), kind, 1.5, tmp_path)
    scaled = run_once(compose_run_config([*base, f"backend.profile_path={profile}"]), progress=False).steps
    assert shipped[["kind", "requests"]].equals(scaled[["kind", "requests"]])
    factor = np.where(shipped["kind"] == kind, 1.5, 1.0)
    np.testing.assert_allclose(scaled["duration"], factor * shipped["duration"], rtol=1e-12)


@pytest.mark.parametrize("argv, message", [
    (["--kind-scales", "mixed=0.9"], "--kind-scales expects KIND=F"),
    (["--kind-scales", "decode=0"], "--kind-scales expects KIND=F"),
    (["--profile", "/nonexistent.csv"], "--profile /nonexistent.csv is not a file"),
])
def test_bad_rerun_variants_stop_in_one_line(argv, message, tmp_path):
    run = Path(__file__).parents[1] / "experiments" / "autoscale" / "h200_run3"
    with pytest.raises(SystemExit, match=message):
        midrun_rerun.main(["--run", str(run), "--out", str(tmp_path), *argv])


@pytest.mark.slow
def test_the_rerun_reproduces_run_3_and_prices_it_with_another_profile(tmp_path):
    """Run 3's simulated side served again is the run's, window for window (9 of 12 within 15%);
    priced with the other committed H200 grid's fit it is 12 of 12 (h200_run3/README.md)."""
    run = Path(__file__).parents[1] / "experiments" / "autoscale" / "h200_run3"
    table = midrun_rerun.rerun(run, tmp_path, "h200", [], ("as_run",))
    again = pd.read_csv(tmp_path / "midrun_rerun_windows.csv")
    committed = pd.read_csv(run / "midrun_compare.csv")
    np.testing.assert_allclose(again["ttft_p90_s_sim"], committed["ttft_p90_s_sim"], rtol=1e-9)
    assert table["windows_within_15pct"].iloc[0] == 9
    grid = Path("experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile_model.csv")
    other = midrun_rerun.rerun(run, tmp_path, "h200", [], ("as_run",), profile=grid)
    assert other["windows_within_15pct"].iloc[0] == 12
