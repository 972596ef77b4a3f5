"""experiments/autoscale: the cold-start probe's calibration is what harness.autoscale.calibration
reads, the mid-run comparison scores windows and the ready moment as the issue asks, bad settings
stop in one line, and (slow) both scripts run end to end on CPU with the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.autoscale import cold_start, midrun_compare, midrun_dp
from harness.autoscale.calibration import read_calibration


def _start(kind: str, load_s: float, capture_s: float = 2.0) -> dict:
    return {"model": "qwen3-0.6b", "hardware": "h100", "kind": kind, "device": "NVIDIA H100", "weight_bytes": 1e9,
            "interpreter_s": 0.2, "process_s": 8.0, "load_s": load_s, "kv_cache_s": 3.0, "capture_s": capture_s,
            "warm_up_s": 0.0, "startup_s": 13.0 + load_s, "first_token_s": 0.1, "load_bytes_per_s": 1e9 / load_s}


def test_the_probes_calibration_is_the_medians_and_reads_back(tmp_path):
    rows = [_start("warm-up", 9.0, capture_s=30.0), _start("disk", 1.0), _start("disk", 3.0), _start("disk", 2.0),
            _start("page cache", 0.25)]
    for row in rows:
        row["weight_read"] = "streamed"
    calibration = cold_start.summarize(rows, 1, "python -m experiments.autoscale.cold_start ...")
    assert calibration["weight_read"] == "streamed"  # the read the starts took goes into the file
    assert calibration["load_s"] == 2.0 and calibration["capture_s"] == 2.0  # the warm-up start is left out
    assert calibration["load_bytes_per_s"] == 0.5e9 and calibration["cached_load_bytes_per_s"] == 4e9
    path = tmp_path / "qwen3-0.6b.cold_start.json"
    path.write_text(json.dumps(calibration))
    assert read_calibration(path).weight_read == "streamed"
    cold = read_calibration(path).cold_start(provision_s=0.0, weight_bytes_per_rank=10**9, eager=False)
    assert (cold.load_s, cold.capture_s, cold.process_s) == (2.0, 2.0, 11.0)
    only_cached = cold_start.summarize([_start("page cache", 0.5)], 1, "")
    assert only_cached["load_bytes_per_s"] == only_cached["cached_load_bytes_per_s"] == 2e9


def _timeline(ttfts, serving):
    n = len(ttfts)
    return pd.DataFrame({"start_s": 10.0 * np.arange(n), "end_s": 10.0 * np.arange(1, n + 1),
                         "arrivals": [100] * (n - 1) + [5], "serving": serving, "ttft_p90_s": ttfts})


def _lifetimes(requested, ready, stop=120.0):
    return pd.DataFrame({"replica": [0, 1], "requested_s": [0.0, requested], "ready_s": [0.0, ready],
                         "stop_s": [stop, stop]})


def test_the_comparison_scores_windows_and_the_ready_moment(tmp_path):
    engine, sim = _timeline([0.01, 2.0, 1.0, 0.5], [1, 1.5, 2, 2]), _timeline([0.0105, 2.5, 1.05, 9.0], [1, 1.4, 2, 2])
    windows = midrun_compare.compare_windows(engine, sim)
    assert windows["within_target"].tolist() == [True, False, True, False]
    assert windows["scored"].tolist() == [True, True, True, False]  # 5 arrivals: shown, not scored
    ready = midrun_compare.ready_times(_lifetimes(30.0, 55.0), _lifetimes(30.0, 57.0))
    assert ready["startup_s_engine"] == 25.0 and ready["ready_error_of_startup"] == pytest.approx(0.08)
    summary = midrun_compare.summarize(windows, ready)
    assert summary["windows_within_15pct"] == 2 and not summary["ttft_target_met"] and summary["ready_target_met"]
    late = midrun_compare.ready_times(_lifetimes(30.0, 120.0), _lifetimes(30.0, 57.0))
    assert not late["ready_before_the_end"] and math.isnan(late["ready_error_of_startup"])
    assert not midrun_compare.summarize(windows, late)["ready_target_met"]
    midrun_compare.plot(windows, ready, "a title", tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
    assert "| 10-20 | 100 |" in midrun_compare.markdown(summary, windows, "t")


@pytest.mark.parametrize("argv, message", [
    (["--rates", "10"], "--rates must be LOW,HIGH"),
    (["--t0", "200"], "--t0 200 must be within the run"),
    (["--t0", "32"], "--t0 32 must be a multiple of --interval 5"),
])
def test_bad_midrun_settings_stop_in_one_line_before_anything_runs(argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        midrun_dp.main(["--out", str(tmp_path), *argv])


def test_the_probe_refuses_a_folder_without_a_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="holds no checkpoint"):
        cold_start.main(["--model", "qwen3-0.6b", "--ckpt", str(tmp_path), "--out", str(tmp_path)])


@pytest.mark.slow
def test_the_probe_times_fresh_processes_on_cpu(tmp_path):
    out = tmp_path / "out"
    cold_start.main(["--model", "tiny-qwen3", "--ckpt", str(tmp_path / "ck"), "--write-checkpoint", "--hardware",
                     "cpu", "--repeats", "1", "--cached", "1", "--no-warm-up", "--out", str(out), "--set",
                     "backend.device=cpu", "--set", "scheduler.max_model_len=512", "--set", "cache.block_size=16"])
    rows = pd.read_csv(out / "cold_start_tiny-qwen3.csv")
    assert rows["kind"].tolist() == ["disk", "page cache"] and rows["resident_before"].tolist() == [0.0, 1.0]
    assert (rows["process_s"] > rows["interpreter_s"]).all() and (rows["startup_s"] > rows["process_s"]).all()
    calibration = read_calibration(out / "profiles" / "cpu" / "tiny-qwen3.cold_start.json")
    assert calibration.tp_size == 1 and calibration.capture_s < 0.1  # CPU: no graphs
    assert rows["weight_read"].tolist() == ["mapped"] * 2  # "auto" onto the CPU
    assert json.loads((out / "profiles" / "cpu" / "tiny-qwen3.cold_start.json").read_text())["weight_read"] == "mapped"


@pytest.mark.slow
def test_the_midrun_driver_runs_end_to_end_on_cpu(tmp_path):
    """Two CPU engine replicas of the tiny model, the second launched at 2 s, and the simulated
    fleet: every table and the plot (the targets are for the GPU run)."""
    midrun_dp.main(["--out", str(tmp_path / "out"), "--cpu", "--ckpt-root", str(tmp_path / "ck"), "--no-probe"])
    out = tmp_path / "out"
    for name in ("midrun_compare.csv", "midrun_summary.csv", "midrun.md", "midrun_timeline.png",
                 "engine/timeline.csv", "sim/timeline.csv", "engine/lifetimes.csv",
                 "midrun_probe/cold_start_tiny-qwen3.csv", "engine/requests.csv.gz", "sim/steps.csv.gz"):
        assert (out / name).is_file(), name
    engine = pd.read_csv(out / "engine" / "lifetimes.csv")
    sim = pd.read_csv(out / "sim" / "lifetimes.csv")
    assert engine["requested_s"].iloc[1] == pytest.approx(2.0, abs=0.3) and sim["requested_s"].iloc[1] == 2.0
    summary = pd.read_csv(out / "midrun_summary.csv").iloc[0]
    assert summary["windows_scored"] >= 1 and summary["startup_s_engine"] > 0
    for side in ("engine", "sim"):  # every request of each side, and every step with its batch
        requests = pd.read_csv(out / side / "requests.csv.gz")
        assert len(requests) == summary_requests(out / side) and set(requests["replica"]) == {0, 1}
        steps = pd.read_csv(out / side / "steps.csv.gz")
        assert list(steps.columns) == list(midrun_dp.STEPS_KEPT) and (steps["duration"] > 0).all()


def summary_requests(folder):
    return int(pd.read_csv(folder / "summary.csv")["num_requests"].iloc[0])


def test_the_set_up_and_a_start_under_load_are_priced(tmp_path):
    """The executor's set-up before its first phase (startup_s less the timed phases) is part of the
    priced start; a calibration measured beside a serving replica ("under_load") prices it instead."""
    rows = [_start("disk", 2.0), _start("page cache", 1.0)]
    for row in rows:
        row["startup_s"] += 0.7  # the set-up no phase timed
    alone = cold_start.summarize(rows, 1, "alone")
    assert alone["setup_s"] == pytest.approx(0.7)
    path = tmp_path / "qwen3-0.6b.cold_start.json"
    path.write_text(json.dumps(alone))
    cold = read_calibration(path).cold_start(0.0, 10**9, eager=False, cached=True)
    assert cold.process_s == pytest.approx(8.0 + 0.7 + 3.0) and cold.load_s == pytest.approx(1.0)
    slow = [{**r, "process_s": r["process_s"] + 2.0, "startup_s": r["startup_s"] + 2.0} for r in rows]
    from experiments.autoscale import loaded_probe

    loaded_probe.merged(path, cold_start.summarize(slow, 1, "beside a serving replica"))
    under = read_calibration(path)
    assert under.under_load is not None and under.under_load.process_s == 10.0
    assert under.cold_start(0.0, 10**9, False, cached=True).total_s == pytest.approx(cold.total_s + 2.0)
    broken = json.loads(path.read_text())
    del broken["under_load"]["capture_s"]
    path.write_text(json.dumps(broken))
    with pytest.raises(Exception, match=r"under_load: a cold-start calibration needs \['capture_s'\]"):
        read_calibration(path)


def test_the_rerun_reads_the_committed_run_and_prices_each_start():
    from pathlib import Path

    from experiments.autoscale import midrun_rerun

    run = Path(__file__).parents[1] / "experiments" / "autoscale" / "h200_run1"
    timeline, lifetimes = midrun_rerun.engine_side(run)
    assert len(timeline) == 13 and lifetimes["ready_s"].iloc[1] == pytest.approx(49.08, abs=0.01)
    priced = midrun_rerun.pricings(run, "h200", "qwen3-0.6b", [], 1_192_135_096, False)
    assert priced["as_run"].total_s == pytest.approx(16.10, abs=0.01)
    assert priced["as_run+setup"].total_s - priced["as_run"].total_s == pytest.approx(0.716, abs=0.01)


RUN2 = Path(__file__).parents[1] / "experiments" / "autoscale" / "h200_run2"


def test_the_rerun_reads_run_2s_layout_and_prices_the_measured_start():
    """Run 2 keeps the engine's tables under engine/; "measured" is the engine's own start-up."""
    from experiments.autoscale import midrun_rerun

    timeline, lifetimes = midrun_rerun.engine_side(RUN2)
    assert len(timeline) == 13 and timeline["ttft_p90_s"].iloc[5] == pytest.approx(0.00807, abs=1e-5)
    priced = midrun_rerun.pricings(RUN2, "h200", "qwen3-0.6b", [], 1_192_135_096, False, ("as_run", "measured"))
    assert list(priced) == ["as_run", "measured"]
    assert priced["as_run"].total_s == pytest.approx(16.861, abs=1e-3)
    assert priced["measured"].total_s == pytest.approx(46.4198 - 30.0001, abs=1e-3)


@pytest.mark.parametrize("argv, message", [
    (["--pricings", "as_run", "guessed"], "--pricings: unknown 'guessed'"),
    (["--step-scales", "0"], "--step-scales must be numbers > 0"),
])
def test_bad_rerun_settings_stop_in_one_line(argv, message, tmp_path):
    from experiments.autoscale import midrun_rerun

    with pytest.raises(SystemExit, match=message):
        midrun_rerun.main(["--run", str(RUN2), "--out", str(tmp_path), *argv])
    with pytest.raises(SystemExit, match="lacks midrun_compare.csv"):
        midrun_rerun.main(["--run", str(tmp_path), "--out", str(tmp_path)])


@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_every_price_scaled_prices_every_step_that_many_times(factor, tmp_path):
    """The rerun's step-price variants: with all requests there at once the schedule does not
    depend on the prices, so each step of the scaled copy's run costs factor times its own."""
    from experiments.fidelity.price_sensitivity import every_price_scaled
    from harness.run import run_once
    from harness.scripting import compose_run_config

    base = ["model=qwen3-0.6b", "hardware=h200", "backend=sim", "backend.cost_model=profiled", "workload=bench",
            "workload.num_requests=40", "scheduler.max_num_seqs=16"]
    shipped = run_once(compose_run_config(base), progress=False).steps
    scaled_profile = every_price_scaled(Path("profiles/h200/qwen3-0.6b.csv"), factor, tmp_path)
    scaled = run_once(compose_run_config([*base, f"backend.profile_path={scaled_profile}"]), progress=False).steps
    assert set(shipped["kind"]) == {"prefill", "decode"}
    assert shipped[["kind", "requests"]].equals(scaled[["kind", "requests"]])
    np.testing.assert_allclose(scaled["duration"], factor * shipped["duration"], rtol=1e-12)


@pytest.mark.slow
def test_the_rerun_reproduces_run_2_and_scores_the_measured_start(tmp_path):
    """Run 2's simulated side served again on CPU, priced as it ran (before the decode kernel's
    programs were priced), is the run's, window for window; with the engine's own start-up the new
    replica is ready when the engine's was."""
    from experiments.autoscale import midrun_rerun

    table = midrun_rerun.rerun(RUN2, tmp_path, "h200", [], ("as_run", "measured"),
                               settings=("backend.decode_programs=false",)).set_index("pricing")
    windows = pd.read_csv(tmp_path / "midrun_rerun_windows.csv")
    committed = pd.read_csv(RUN2 / "midrun_compare.csv")
    again = windows[windows["pricing"] == "as_run"].reset_index(drop=True)
    np.testing.assert_allclose(again["ttft_p90_s_sim"], committed["ttft_p90_s_sim"], rtol=1e-9)
    assert table.loc["as_run", "windows_within_15pct"] == 10
    assert abs(table.loc["measured", "ready_error_s"]) < 1e-3


@pytest.mark.slow
def test_the_rerun_reproduces_the_committed_run(tmp_path):
    """Served again with the start-up the run's simulator was given, the comparison is the run's."""
    from pathlib import Path

    from experiments.autoscale import midrun_rerun

    run = Path(__file__).parents[1] / "experiments" / "autoscale" / "h200_run1"
    table = midrun_rerun.rerun(run, tmp_path, "h200", []).set_index("pricing")
    committed = pd.read_csv(run / "midrun_summary.csv").iloc[0]
    assert table.loc["as_run", "ready_error_of_startup"] == pytest.approx(committed["ready_error_of_startup"], abs=1e-3)
    assert table.loc["as_run", "windows_within_15pct"] == committed["windows_within_15pct"]


def test_slo_decisions_records_each_evaluation(tmp_path, monkeypatch, capsys):
    from experiments.autoscale import slo_decisions

    out = tmp_path / "decisions.csv"
    monkeypatch.setattr("sys.argv", [
        "slo_decisions", "--startup-s", "20", "--out", str(out), "workload=poisson", "workload.prompt_len.high=300",
        "workload.output_len.high=100", "scheduler.max_num_seqs=8", "workload.rate_profile=[[0,5],[20,80]]",
        "workload.duration_s=60", "autoscale.policy=slo", "autoscale.interval_s=5", "slo.ttft_p90_s=0.5",
        "autoscale.max_replicas=6", "output.progress=false"])
    assert slo_decisions.main() == 0
    rows = pd.read_csv(out)
    assert list(rows["time_s"]) == [5.0 * (i + 1) for i in range(len(rows))] and len(rows) >= 10
    assert (rows["startup_s"] == 20.0).all() and (rows["desired"] > rows["serving"] + rows["starting"]).any()
    assert "SLO attainment" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["slo_decisions", "--out", str(out), "autoscale.policy=queue"])
    assert slo_decisions.one_line_errors(slo_decisions.main) == 2
