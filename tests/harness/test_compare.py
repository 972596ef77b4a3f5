"""experiment=compare end to end on the CPU engine (tiny model): the pipeline CI can run.

Offline: both simulated schedules are the engine's, step by step, and the report says so. The
report is internally consistent: throughputs are tokens over makespans of the run folders'
CSVs, errors are (sim - engine) / engine, the replay of an identical schedule prices it exactly as
the simulation did, and measured step times add up to the engine's clock.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.convert import ConfigError
from harness.output.metrics import read_steps
from harness.study import run_study
from tests.harness.conftest import compose_config

pytest.importorskip("torch")

# Small blocks and a small cache: the offline batch preempts.
TINY = ["model=tiny-qwen3", "hardware=cpu", "backend.device=cpu", "workload.num_requests=12",
        "workload.prompt_len.high=160", "workload.output_len.low=8", "workload.output_len.high=48",
        "scheduler.max_model_len=512", "cache.block_size=16", "cache.num_blocks=40"]


@pytest.fixture(scope="module")
def offline(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare-offline")
    run_study(compose_config(["experiment=compare", f"backend.model={tiny_checkpoint}", *TINY]), out)
    return out


def _run_tables(out, run):
    return (pd.read_csv(out / run / "requests.csv"), read_steps(out / run),
            pd.read_csv(out / run / "summary.csv").iloc[0])


def test_offline_schedules_are_identical_and_the_report_says_so(offline):
    schedule = pd.read_csv(offline / "compare_schedule.csv")
    assert list(schedule["run"]) == ["sim_profiled", "sim_roofline"]
    assert schedule["schedule_identical"].all() and (schedule["first_divergent_step"] == -1).all()
    engine_steps = read_steps(offline / "engine")
    assert engine_steps["preempted"].sum() > 0  # the comparison covers preemption
    for run in ("sim_profiled", "sim_roofline"):
        sim_steps = read_steps(offline / run)
        assert list(sim_steps["schedule_hash"]) == list(engine_steps["schedule_hash"])
        assert (sim_steps["preempted"].to_numpy() == engine_steps["preempted"].to_numpy()).all()
    report = (offline / "compare.md").read_text()
    assert report.count("schedule_identical: True") == 2
    targets = pd.read_csv(offline / "compare_targets.csv")
    assert targets[targets["target"].isin(["schedule identical", "preemptions equal"])]["met"].all()
    for name in ("compare_metrics.png", "compare_steps.png", "compare_latency.png", "profile.csv", "profile_model.csv"):
        assert (offline / name).stat().st_size > 0, name


def test_compare_table_is_consistent_with_the_run_folders(offline):
    table = pd.read_csv(offline / "compare.csv").set_index("metric")
    for run in ("engine", "sim_profiled", "sim_roofline"):
        requests, steps, summary = _run_tables(offline, run)
        makespan = summary["makespan_s"]
        # the wall clock is read once more after the last update
        assert requests["finish"].max() <= makespan <= requests["finish"].max() + 0.01
        assert table.loc["makespan_s", run] == pytest.approx(makespan)
        assert table.loc["output_tok_s", run] == pytest.approx(requests["output_tokens"].sum() / makespan)
        assert table.loc["input_tok_s", run] == pytest.approx(requests["prompt_tokens"].sum() / makespan)
        assert table.loc["preemptions", run] == requests["preemptions"].sum() == steps["preempted"].sum()
        assert table.loc["ttft_p90_s", run] == pytest.approx(np.percentile(requests["ttft"], 90))
        assert table.loc["num_steps", run] == len(steps)
    for run in ("sim_profiled", "sim_roofline"):
        for metric in ("output_tok_s", "tpot_p50_s", "makespan_s"):
            expected = (table.loc[metric, run] - table.loc[metric, "engine"]) / table.loc[metric, "engine"]
            assert table.loc[metric, f"err_{run}"] == pytest.approx(expected)


def test_replay_adds_up_to_the_engine_clock_and_to_the_simulations(offline):
    replayed = pd.read_csv(offline / "compare_steps.csv")
    requests, steps, summary = _run_tables(offline, "engine")
    assert (steps["host_s"] >= 0).all()
    assert replayed["measured_s"].to_numpy() == pytest.approx((steps["duration"] + steps["host_s"]).to_numpy())
    # offline: no waiting, so the engine's clock is its steps and host time, but for the final update
    tail = summary["makespan_s"] - replayed["measured_s"].sum()
    assert 0 <= tail < 0.05
    table = pd.read_csv(offline / "compare.csv").set_index("metric")
    assert table.loc["replay_busy_s", "engine"] == pytest.approx(replayed["measured_s"].sum())
    for name in ("profiled", "roofline"):
        err = (replayed[f"predicted_{name}_s"] - replayed["measured_s"]) / replayed["measured_s"]
        assert replayed[f"err_{name}"].to_numpy() == pytest.approx(err.to_numpy())
        assert table.loc["replay_step_abs_err_median", f"sim_{name}"] == pytest.approx(np.median(np.abs(err)))
        # the schedule is the engine's, so pricing the engine's steps is the simulation itself
        assert replayed[f"predicted_{name}_s"].sum() == pytest.approx(table.loc["makespan_s", f"sim_{name}"], rel=1e-9)


def test_online_divergence_is_reported_where_it_happens(tiny_checkpoint, tmp_path):
    run_study(compose_config(["experiment=compare", f"backend.model={tiny_checkpoint}", *TINY, "workload=poisson",
                              "workload.rate=400", "workload.num_requests=16", "compare.cost_models=[roofline]",
                              "output.plots=false"]), tmp_path)
    schedule = pd.read_csv(tmp_path / "compare_schedule.csv").iloc[0]
    engine = read_steps(tmp_path / "engine")["schedule_hash"].tolist()
    sim = read_steps(tmp_path / "sim_roofline")["schedule_hash"].tolist()
    first = next((i for i, (a, b) in enumerate(zip(engine, sim)) if a != b), -1 if len(engine) == len(sim) else
                 min(len(engine), len(sim)))
    assert schedule["first_divergent_step"] == first
    assert bool(schedule["schedule_identical"]) == (first == -1)
    report = (tmp_path / "compare.md").read_text()
    if first >= 0:
        assert f"first divergent step {first} " in report
        assert schedule["engine_time_at_divergence_s"] == pytest.approx(
            read_steps(tmp_path / "engine")["start"].iloc[first])


def test_a_saved_engine_run_is_compared_again_without_the_engine(offline, tmp_path):
    # backend=sim: no checkpoint needed, the engine side comes from the folder
    common = [o for o in TINY if not o.startswith("backend.")]
    run_study(compose_config(["experiment=compare", "backend=sim", *common, f"compare.engine_dir={offline / 'engine'}",
                              f"compare.profile_path={offline / 'profile_model.csv'}", "output.plots=false"]), tmp_path)
    before = pd.read_csv(offline / "compare.csv")
    after = pd.read_csv(tmp_path / "compare.csv")
    pd.testing.assert_frame_equal(before, after)


def test_a_saved_engine_run_from_before_a_new_workload_field_still_compares(offline, tmp_path):
    # a run saved before a config field existed had that field's default; other differences still count
    import json
    import shutil

    saved = tmp_path / "saved"
    shutil.copytree(offline / "engine", saved)
    meta = json.loads((saved / "engine.json").read_text())
    del meta["workload"]["trace_repeat"]
    (saved / "engine.json").write_text(json.dumps(meta))
    common = [o for o in TINY if not o.startswith("backend.")]
    base = ["experiment=compare", "backend=sim", *common, f"compare.engine_dir={saved}",
            f"compare.profile_path={offline / 'profile_model.csv'}", "output.plots=false"]
    run_study(compose_config(base), tmp_path / "out")
    pd.testing.assert_frame_equal(pd.read_csv(offline / "compare.csv"), pd.read_csv(tmp_path / "out" / "compare.csv"))
    with pytest.raises(ConfigError, match="had another workload config .workload.seed=0"):
        run_study(compose_config([*base, "workload.seed=7"]), tmp_path / "again")
