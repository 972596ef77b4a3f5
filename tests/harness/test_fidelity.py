"""experiment=fidelity end to end on the CPU engine (tiny model): the held-out pipeline CI runs so
it cannot rot. Few requests per cell; the numbers are not the point (a shared CPU's timings are
noise), the table's consistency is. Offline, the schedules are: the CPU engine repeats itself and
every simulation repeats the engine, step by step (as tests/harness/test_compare.py asserts of
experiment=compare)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.convert import ConfigError
from harness.fidelity import study as fidelity
from harness.fidelity.report import COUNTED_METRICS, OFFLINE_METRICS
from harness.fidelity.schedules import COLUMNS as SCHEDULE_COLUMNS
from harness.study import run_study
from tests.harness.conftest import compose_config

pytest.importorskip("torch")

COLUMNS = ["model", "hardware", "workload", "load", "metric", "engine", "sim", "err", "cost_model", "engine_spread",
           "sim_lo", "sim_hi", "in_interval"]
WORKLOADS = ["prefill_heavy", "conversation", "shared_prefix", "preempting_bench", "code_completion"]
CPU_RUN = ["experiment=fidelity", "model=tiny-qwen3", "hardware=cpu", "backend.device=cpu",
           "scheduler.max_model_len=512", "cache.block_size=16", "fidelity.length_scale=0.0625",
           "fidelity.num_requests=3", "fidelity.interval.draws=2", "fidelity.preempt_num_blocks=12"]


@pytest.fixture(scope="module")
def heldout(tiny_checkpoint, tmp_path_factory):
    run_dir, results = tmp_path_factory.mktemp("fidelity-run"), tmp_path_factory.mktemp("fidelity-results")
    run_study(compose_config([
        *CPU_RUN, f"backend.model={tiny_checkpoint}", f"fidelity.workloads=[{','.join(WORKLOADS)}]",
        "fidelity.loads=[0.8]", "fidelity.grid=quick", f"fidelity.results_dir={results}",
        f"fidelity.steps_dir={run_dir / 'steps'}"]), run_dir)
    return pd.read_csv(results / "heldout.csv"), results, run_dir


def test_every_cell_has_both_cost_models_and_the_engines_repeats(heldout):
    table, _, _ = heldout
    assert list(table.columns[:len(COLUMNS)]) == COLUMNS
    assert list(dict.fromkeys(table["workload"])) == WORKLOADS
    for _, cell in table.groupby(["workload", "load", "metric"]):
        assert sorted(cell["cost_model"]) == ["profiled", "roofline"]
    assert set(table["load"].astype(str)) == {"offline", "0.8"}
    assert (table["engine_repeats"] == 2).all()
    # a metric no request has (TPOT of one-token outputs) is NaN on both sides, never made up
    measured = table["engine"].notna()
    assert (table.loc[measured, "engine_spread"] >= 0).all()
    nonzero = table["engine"] != 0  # a count (preemptions) may be 0 on both sides: err 0
    assert np.allclose(table.loc[nonzero, "err"], (table["sim"] - table["engine"])[nonzero] / table["engine"][nonzero],
                       equal_nan=True)
    assert (table.loc[~nonzero & (table["sim"] == 0), "err"] == 0).all()
    assert measured[table["metric"].str.startswith("ttft")].all()


def test_loads_are_fractions_of_the_capacity_the_engine_measured(heldout):
    table, _, _ = heldout
    for workload, part in table.groupby("workload"):
        capacity = part.loc[(part["load"] == "offline") & (part["metric"] == "request_s"), "engine"].iloc[0]
        rates = part.loc[part["load"] == "0.8", "rate_req_s"]
        assert np.allclose(rates, 0.8 * capacity), workload


def test_profiled_rows_carry_an_interval_and_say_whether_the_engine_is_inside(heldout):
    table, _, _ = heldout
    latency = table["metric"].str.contains("_p[59]0_s") & (table["load"] == "0.8")
    profiled = table[(table["cost_model"] == "profiled") & latency]
    assert len(profiled)
    assert (profiled["sim_lo"] <= profiled["sim"]).all() and (profiled["sim"] <= profiled["sim_hi"]).all()
    inside = (profiled["sim_lo"] <= profiled["engine"]) & (profiled["engine"] <= profiled["sim_hi"])
    assert (profiled["in_interval"].astype(str) == inside.astype(str)).all()
    assert table.loc[table["cost_model"] == "roofline", "sim_lo"].isna().all()


def test_results_dir_holds_summaries_only(heldout):
    _, results, run_dir = heldout
    assert sorted(p.name for p in results.iterdir()) == ["heldout.csv", "heldout.png", "schedules.csv"]
    assert (results / "heldout.png").stat().st_size > 0
    assert (run_dir / "profile_model.csv").is_file()  # the grid-only calibration, with residuals
    assert (pd.read_csv(run_dir / "profile_model.csv")["kind"] == "residual").any()


def test_schedules_have_a_row_per_class_repeat_and_cost_model_and_offline_they_are_the_engines(heldout):
    _, results, _ = heldout
    schedules = pd.read_csv(results / "schedules.csv")
    assert list(schedules.columns) == list(SCHEDULE_COLUMNS)
    assert list(dict.fromkeys(schedules["workload"])) == WORKLOADS
    for workload, part in schedules.groupby("workload"):
        runs = sorted(zip(part["engine_repeat"], part["cost_model"]))
        expected = [(0, "profiled"), (0, "roofline"), (1, "engine_repeat"), (1, "profiled"), (1, "roofline")]
        assert runs == expected, workload
        assert part["engine_steps"].nunique() == 1 and (part["engine_steps"] > 0).all(), workload
    # the core's guarantee offline on the CPU backend: one schedule, whoever runs or prices it
    assert schedules["schedule_identical"].all()
    assert (schedules["first_divergent_step"] == -1).all()
    assert (schedules["identical_steps"] == schedules["engine_steps"]).all()
    assert (schedules["sim_steps"] == schedules["engine_steps"]).all()
    assert (schedules["sim_preemptions"] == schedules["engine_preemptions"]).all()
    preempting = schedules[schedules["workload"] == "preempting_bench"]
    assert (preempting["engine_preemptions"] > 0).all()  # the comparison covers preemption


def test_steps_dir_holds_each_engine_runs_steps_priced_by_each_cost_model(heldout):
    """fidelity.steps_dir: a replay per engine run of every cell; its profiled prices are the fit's
    own prices of the recorded features, and only the shared-prefix class can read blocks again."""
    from sim.profiled import ProfiledCostModel

    _, _, run_dir = heldout
    names = sorted(p.name for p in (run_dir / "steps").glob("*.csv.gz"))
    assert names == sorted(f"{w}_{load}_{r}.csv.gz" for w in WORKLOADS for load in ("offline", "0.8") for r in (0, 1))
    fit = ProfiledCostModel.load(run_dir / "profile_model.csv")
    for name in names:
        steps = pd.read_csv(run_dir / "steps" / name)
        assert len(steps) > 0 and list(steps["step"]) == list(range(len(steps))), name
        expected = {"predicted_profiled_s", "predicted_roofline_s", "decode_repeated_tokens", "slept_s"}
        assert expected <= set(steps.columns)
        if not name.startswith("shared_prefix"):
            assert steps["decode_repeated_tokens"].sum() == 0, name
        features = steps.rename(columns={"measured_execute_s": "duration_s"})
        features["previous_duration_s"] = features["duration_s"].shift(1).where(features["step"] != 0)
        np.testing.assert_allclose(steps["predicted_execute_profiled_s"], fit.predict(features), rtol=1e-9)
        assert (steps["predicted_roofline_s"] > 0).all() and (steps["measured_s"] > 0).all(), name


def test_steps_dir_holds_each_cells_windows_for_engine_and_simulator(heldout):
    """<class>_<load>_windows.csv beside the replays: a row per engine run and simulated run. Each
    request's window (first token to finish) holds its output tokens less one decode steps on
    either side (a preempted request may decode again), and offline, where the schedules are the
    engine's, the same prefill steps."""
    _, _, run_dir = heldout
    for workload in WORKLOADS:
        for load in ("offline", "0.8"):
            windows = pd.read_csv(run_dir / "steps" / f"{workload}_{load}_windows.csv").set_index("run")
            assert list(windows.index) == ["engine 0", "engine 1", "sim profiled", "sim roofline"]
            if workload == "preempting_bench":
                continue
            decodes = windows.loc[windows["requests"] > 0, "all_decode_steps"].to_numpy()
            np.testing.assert_allclose(decodes, decodes[:1].repeat(len(decodes)), err_msg=f"{workload} {load}")
            if load == "offline":
                assert windows["prefill_steps"].nunique() == 1 and windows["decode_steps"].nunique() == 1, workload


def test_no_loads_is_an_offline_only_run(heldout, tiny_checkpoint, tmp_path, monkeypatch):
    """fidelity.loads=[]: capacity, the offline cells and their schedules (the carried model's
    too), no load cell and no plot of error against load. The class is served once, unmeasured,
    before its first measured repeat (fidelity.warmup)."""
    _, _, run_dir = heldout
    fit = run_dir / "profile_model.csv"
    labels = []

    def run_once_noting_labels(rc, *args, **kwargs):
        labels.append(kwargs.get("label", ""))
        return run_once(rc, *args, **kwargs)

    run_once = fidelity.run_once
    monkeypatch.setattr(fidelity, "run_once", run_once_noting_labels)
    run_study(compose_config([
        *CPU_RUN, f"backend.model={tiny_checkpoint}", "fidelity.workloads=[preempting_bench]", "fidelity.loads=[]",
        f"fidelity.profile_path={fit}", f"fidelity.carried_profile_path={fit}", "fidelity.cost_models=[roofline]",
        f"fidelity.results_dir={tmp_path}"]), tmp_path / "run")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["heldout.csv", "schedules.csv"]
    table = pd.read_csv(tmp_path / "heldout.csv")
    assert set(table["load"].astype(str)) == {"offline"}
    assert sorted(set(table["metric"])) == sorted(OFFLINE_METRICS + COUNTED_METRICS)
    assert labels[:3] == ["warm-up preempting_bench", "engine preempting_bench #0", "engine preempting_bench #1"]
    schedules = pd.read_csv(tmp_path / "schedules.csv")
    assert sorted(zip(schedules["engine_repeat"], schedules["cost_model"])) == [
        (0, "carried"), (0, "roofline"), (1, "carried"), (1, "engine_repeat"), (1, "roofline")]
    assert schedules["schedule_identical"].all() and (schedules["engine_preemptions"] > 0).all()


@pytest.mark.parametrize("loads", ["[2.0]", "[0.5,0]", "[-0.1]"])
def test_bad_loads_stop_the_run_in_one_line_before_the_engine_runs(tiny_checkpoint, tmp_path, loads):
    with pytest.raises(ConfigError) as error:
        run_study(compose_config([*CPU_RUN, f"backend.model={tiny_checkpoint}", f"fidelity.loads={loads}"]),
                  tmp_path / "run")
    message = str(error.value)
    assert "\n" not in message and message.startswith("fidelity.loads") and "(0, 1.5]" in message
    assert not (tmp_path / "run" / "profile.csv").exists()


def test_the_grid_profiles_steps_that_share_prefix_blocks_and_the_fit_prices_their_repeats(heldout):
    _, _, run_dir = heldout
    profile = pd.read_csv(run_dir / "profile.csv")
    grid = profile[profile["set"] == "grid"]
    assert (grid["decode_repeated_tokens"] > 0).sum() >= 4 and (grid["prefill_repeated_tokens"] > 0).any()
    coefficients = pd.read_csv(run_dir / "profile_model.csv")
    priced = coefficients[(coefficients["kind"] == "linear") & (coefficients["name"] == "decode_repeated_tokens")]
    decode_regimes = set(coefficients["regime"]) & {"decode_graph", "decode_eager"}  # eager only on a CPU
    assert decode_regimes and decode_regimes <= set(priced["regime"])


def test_a_carried_model_is_simulated_beside_the_fit_and_the_same_model_predicts_the_same(heldout, tiny_checkpoint,
                                                                                          tmp_path):
    """fidelity.carried_profile_path adds cost model "carried" (a fit from another GPU, carried here)
    to every cell; given this run's own fit it must repeat the profiled point predictions exactly."""
    _, _, run_dir = heldout
    fit = run_dir / "profile_model.csv"
    run_study(compose_config([
        "experiment=fidelity", f"backend.model={tiny_checkpoint}", "model=tiny-qwen3", "hardware=cpu",
        "backend.device=cpu",
        "scheduler.max_model_len=512", "cache.block_size=16", "fidelity.length_scale=0.0625", "fidelity.num_requests=3",
        "fidelity.workloads=[bursty]", "fidelity.loads=[0.8]", f"fidelity.profile_path={fit}",
        f"fidelity.carried_profile_path={fit}", "fidelity.interval.draws=2", "fidelity.cost_models=[profiled]",
        f"fidelity.results_dir={tmp_path}"]), tmp_path / "run")
    table = pd.read_csv(tmp_path / "heldout.csv")
    carried, profiled = (table[table["cost_model"] == c].reset_index(drop=True) for c in ("carried", "profiled"))
    assert len(carried) == len(profiled) > 0
    np.testing.assert_array_equal(carried["sim"], profiled["sim"])
    assert carried["sim_lo"].isna().all()


def test_a_missing_carried_model_is_named_before_the_engine_runs(tiny_checkpoint, tmp_path):
    with pytest.raises(Exception, match="fidelity.carried_profile_path"):
        run_study(compose_config([
            "experiment=fidelity", f"backend.model={tiny_checkpoint}", "model=tiny-qwen3", "hardware=cpu",
            "backend.device=cpu", f"fidelity.carried_profile_path={tmp_path / 'absent.csv'}"]), tmp_path / "run")
