"""The experiments/ scripts stay importable, thin and runnable: each module imports without side
effects, takes --help, and the CPU-safe ones run on the tiny model."""

from __future__ import annotations

import ast
import gzip
import importlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.convert import ConfigError
from harness.scripting import RAW_TABLES_COMMIT, MissingInputs, compose_run_config, read_steps

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (REPO / "experiments").rglob("*.py"))
HAS_TRITON = importlib.util.find_spec("triton") is not None
TINY = ["model=tiny-qwen3", "hardware=cpu", "scheduler.max_model_len=512", "cache.block_size=16",
        "workload.num_requests=12", "workload.prompt_len.high=200", "workload.output_len.low=8",
        "workload.output_len.high=32"]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def load(path: Path):
    """The script as a module (experiments.<study>.<name>), or a skip where it needs Triton and there is none."""
    try:
        return importlib.import_module(module_name(path))
    except ModuleNotFoundError as error:
        if error.name == "triton" and not HAS_TRITON:
            pytest.skip(f"{path.name} needs triton")
        raise


def script(name: str):
    return load(REPO / "experiments" / name)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(REPO / "experiments")))
def test_script_runs_nothing_on_import_and_takes_help(path, capsys):
    """Importing runs nothing (a GPU script that needs Triton is skipped where there is none)."""
    tree = ast.parse(path.read_text())
    calls = [ast.unparse(n) for n in tree.body if isinstance(n, ast.Expr) and not isinstance(n.value, ast.Constant)]
    assert all(c.startswith("os.environ.setdefault(") for c in calls), f"{path.name} runs {calls} on import"
    assert "sys.path" not in path.read_text()
    module = load(path)
    if not hasattr(module, "main"):  # a helper the scripts beside it import
        return
    guarded = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(guarded) == 1, f"{path.name}: one `if __name__ == '__main__'` block"
    try:
        code = module.main(["--help"])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code in (0, None)
    assert "usage" in capsys.readouterr().out.lower() or path.name == "calibrate_and_compare.py"


def test_read_steps_takes_either_compression_and_names_the_commit_when_neither_is_there(tmp_path):
    frame = pd.DataFrame({"kind": ["prefill", "decode"], "duration": [0.5, 0.01]})
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    frame.to_csv(plain / "steps.csv", index=False)
    with gzip.open(packed / "steps.csv.gz", "wt") as f:
        frame.to_csv(f, index=False)
    for folder in (plain, packed):
        pd.testing.assert_frame_equal(read_steps(folder), frame)
        pd.testing.assert_frame_equal(read_steps(folder / "steps.csv"), frame)  # the name older callers pass
    with pytest.raises(MissingInputs) as missing:
        read_steps(tmp_path)
    assert RAW_TABLES_COMMIT in str(missing.value.code) and "\n" not in str(missing.value.code)


@pytest.mark.parametrize("name, argv", [
    ("calibration/price_check.py", ["h100_run5"]),
    ("calibration/price_check.py", ["h100_run6"]),
    ("calibration/summarize_run.py", ["h100_run3"]),
    ("calibration/summarize_run.py", ["h100_run6"]),  # its repeatability table reads run 5
    ("calibration/refit.py", ["experiments/calibration/h100_run6/qwen3_0_6b", "--out", "{tmp}/refit"]),
    ("calibration/recompare.py", ["experiments/calibration/h100_run6/qwen3_0_6b", "--profile",
                                  "profiles/h100/qwen3-0.6b.csv", "--out", "{tmp}/re"]),
])
def test_scripts_whose_raw_inputs_left_the_tree_stop_with_one_line(name, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit_info:
        script(name).main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    message = str(exit_info.value.code)
    assert message.startswith("error:") and RAW_TABLES_COMMIT in message and "\n" not in message
    assert not (tmp_path / "re").exists() or not any((tmp_path / "re").rglob("compare.csv"))


def test_bench_sim_speed_times_the_librarys_run(monkeypatch):
    bench = script("bench_sim_speed.py")
    calls = []
    real = bench.run_once
    monkeypatch.setattr(bench, "run_once", lambda rc, **kw: calls.append(rc) or real(rc, **kw))
    row = bench.time_case(TINY)
    assert len(calls) == 1 and calls[0].workload.num_requests == 12
    assert row["requests"] == 12 and row["steps"] > 0 and row["output_tok_s"] > 0
    assert 0 < row["loop_s"] <= row["total_s"] and row["setup_and_tables_s"] >= 0 and row["cpu_s"] > 0


def test_calibrate_overrides_split_into_every_run_stage_grid_and_own_settings():
    calibrate = script("calibration/calibrate_and_compare.py")
    plan = calibrate.parse(["model=tiny-qwen3", "poisson:workload.num_requests=40", "grid.num_random=3",
                            "calibrate.out=/tmp/x", "calibrate.grid=quick", "calibrate.workloads=[bench,azure]"])
    assert plan.base == ["experiment=compare", "output.progress=false", "model=tiny-qwen3"]
    assert plan.stages["poisson"][-1] == "workload.num_requests=40"
    assert plan.stages["bench"] == calibrate.STAGES["bench"]
    assert plan.grid.num_random == 3 and plan.grid.prefill_tokens == (16, 64, 256, 1024)  # quick grid's
    assert plan.settings.workloads == ("bench", "azure") and plan.settings.out == "/tmp/x"
    # each stage's overrides compose into a valid run on their own
    assert compose_run_config(plan.base + plan.stages["poisson"]).workload.num_requests == 40


@pytest.mark.parametrize("argv, field", [
    (["calibrate.out=/x", "calibrate.bogus=1"], "calibrate"),
    (["calibrate.out=/x", "calibrate.poisson_load=2"], "calibrate.poisson_load"),
    (["calibrate.out=/x", "grid.repeats=0"], "ProfileGrid"),
    (["calibrate.out=/x", "bnech:workload.seed=1"], "bnech"),
    (["calibrate.grid=full"], "out"),
])
def test_calibrate_rejects_bad_settings_naming_them(argv, field):
    calibrate = script("calibration/calibrate_and_compare.py")
    with pytest.raises((ConfigError, ValueError), match=field):
        calibrate.parse(argv)


def test_calibrate_reports_a_bad_hydra_override_in_one_line(tmp_path, capsys):
    calibrate = script("calibration/calibrate_and_compare.py")
    assert calibrate.main(["model=no_such_model", f"calibrate.out={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no_such_model" in err and "\n" not in err


@pytest.mark.slow
def test_calibrate_refit_and_recompare_on_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "cal"
    argv = [*TINY, "backend.device=cpu", f"calibrate.out={out}", "calibrate.grid=quick", "grid.num_random=2",
            "calibrate.workloads=[bench]", "calibrate.online_calibration=false",
            "calibration:workload.num_requests=16", "bench:workload.num_requests=8"]
    assert script("calibration/calibrate_and_compare.py").main(argv) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert {"load", "profile", "calibration_run", "fit", "compare_bench"} <= set(meta["stages"])
    table = pd.read_csv(out / "compare_bench" / "compare.csv").set_index("metric")
    assert table.loc["num_steps", "engine"] == table.loc["num_steps", "sim_profiled"]  # offline: same schedule
    assert script("calibration/refit.py").main([str(out), "--out", str(tmp_path / "refit")]) == 0
    assert set(pd.read_csv(tmp_path / "refit" / "validation.csv")["set"]) >= {"real_steps"}
    assert script("calibration/recompare.py").main(
        [str(out), "--profile", str(tmp_path / "refit" / "model.csv"), "--out", str(tmp_path / "re")]) == 0
    again = pd.read_csv(tmp_path / "re" / "compare_bench" / "compare.csv").set_index("metric")
    assert again.loc["output_tok_s", "engine"] == pytest.approx(table.loc["output_tok_s", "engine"])


def dry_run(capsys, *argv: str) -> list[str]:
    script("gpu_run.py").main(["--dry-run", *argv])
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]


def test_gpu_run_names_each_step_and_writes_under_out(tmp_path, capsys):
    lines = dry_run(capsys, "--out", str(tmp_path), "wheels", "env", "pytest", "bench", "calibrate", "probe",
                    "--model", "qwen3-8b", "--workloads", "bench", "azure", "--set", "grid.num_random=2",
                    "--probes", "kernels/decode_balance.py", "--tests", "tests/engine")
    by_step = {}
    for line in lines:
        step, command = line[1:].split("] ", 1)
        by_step.setdefault(step, []).append(command)
    assert list(by_step) == ["wheels", "env", "pytest", "bench", "calibrate", "probe"]
    assert by_step["wheels"][0].endswith("-m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl")
    assert "-m gpu" in by_step["pytest"][0] and by_step["pytest"][0].endswith("tests/engine")
    assert "experiments/engine/bench_engine.py" in by_step["bench"][1] and f"{tmp_path}/bench" in by_step["bench"][1]
    calibrate = by_step["calibrate"][0]
    for part in ("calibrate_and_compare.py", "model=qwen3-8b", f"calibrate.out={tmp_path}/qwen3-8b",
                 "'calibrate.workloads=[bench,azure]'", "grid.num_random=2"):
        assert part in calibrate
    assert "-m experiments.kernels.decode_balance --model qwen3-8b" in by_step["probe"][0]


def test_gpu_run_compares_with_the_calibration_runs_own_workload_overrides(tmp_path, capsys):
    lines = dry_run(capsys, "--out", str(tmp_path), "compare", "--workloads", "bench", "gamma", "--repeats", "2")
    meta = json.loads((REPO / "experiments/calibration/h100_run6/qwen3_0_6b/meta.json").read_text())
    bench = " ".join(meta["stages"]["compare_bench"]["overrides"])
    assert len(lines) == 4 and all("-m harness experiment=compare" in line for line in lines)
    assert bench in lines[0] and "workload=gamma" in lines[1]
    shipped_fit = f"compare.profile_path={REPO}/profiles/h100/qwen3-0.6b.csv "
    assert all(shipped_fit in line for line in lines)
    assert [line.rsplit("hydra.run.dir=", 1)[1] for line in lines] == [
        f"{tmp_path}/compare_{w}_r{r}" for r in (1, 2) for w in ("bench", "gamma")]


def test_gpu_run_skips_steps_once_the_call_is_out_of_time(tmp_path, capsys):
    script("gpu_run.py").main(["--out", str(tmp_path), "--limit-s", "0", "env", "pytest"])
    out = capsys.readouterr().out
    assert "env: skipped" in out and "pytest: skipped" in out
    assert not (tmp_path / "env.txt").exists() and not (tmp_path / "pytest_gpu.log").exists()


def test_gpu_run_bundles_what_the_call_wrote(tmp_path, capsys):
    import tarfile

    (tmp_path / "compare_bench").mkdir()
    (tmp_path / "compare_bench" / "compare.md").write_text("# table\n")
    script("gpu_run.py").main(["--out", str(tmp_path), "bundle"])
    with tarfile.open(tmp_path / "bundle.tar.gz") as bundle:
        assert "./compare_bench/compare.md" in bundle.getnames()
        assert not any(name.endswith("bundle.tar.gz") for name in bundle.getnames())


def test_bench_sim_speed_writes_the_committed_results_only_when_asked(tmp_path, monkeypatch):
    bench = script("bench_sim_speed.py")
    assert bench.RESULTS == REPO / "experiments" / "results" / "sim_speed.csv"
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "committed" / "sim_speed.csv")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench.os, "sched_setaffinity", lambda *a: None, raising=False)  # not the test process
    row = {"requests": 1, "steps": 1, "simulated_makespan_s": 1.0, "output_tok_s": 1.0, "loop_s": 0.1,
           "setup_and_tables_s": 0.1, "total_s": 0.2, "cpu_s": 0.2}
    monkeypatch.setattr(bench, "time_case", lambda overrides, tables=None: row)
    monkeypatch.setattr(bench, "time_day", lambda overrides: {"total_s": 1.0, "cpu_s": 1.0})
    monkeypatch.setattr(bench, "profile_case", lambda overrides: {"simulator": 1.0})
    bench.main(["--repeats", "1", "--profile"])
    both = ["sim_speed.csv", "sim_speed_profile.csv"]
    assert sorted(p.name for p in (tmp_path / "outputs" / "bench").iterdir()) == both
    assert not (tmp_path / "committed").exists()  # untracked by default (.gitignore: outputs/)
    bench.main(["--repeats", "1", "--profile", "--update-results"])
    assert sorted(p.name for p in (tmp_path / "committed").iterdir()) == both
    with pytest.raises(SystemExit):
        bench.main(["--update-results", "--out", "x.csv"])


def test_bench_plan_speed_writes_the_committed_result_only_when_asked(monkeypatch):
    bench = script("bench_plan_speed.py")
    written = []
    monkeypatch.setattr(bench, "run", lambda args: written.append(args.out) or 0)
    bench.main([])
    bench.main(["--out", "mine.csv"])
    bench.main(["--update-results"])
    assert written == [Path("outputs", "bench", "plan_speed.csv"), Path("mine.csv"),
                       REPO / "experiments" / "results" / "plan_speed.csv"]
    with pytest.raises(SystemExit):
        bench.main(["--update-results", "--out", "x.csv"])


def test_plan_speed_ab_names_what_differs_and_keeps_the_tp_sizes_asked_for():
    ab = script("plan_speed_ab.py")
    same = {"row": {"ttft_p50_s": 0.5, "error": "", "e2e_p99_s": float("nan")},
            "tables": {"requests": "a", "steps": "b"}}
    assert ab.differences(same, json.loads(json.dumps(same))) == []
    other = {"row": {**same["row"], "ttft_p50_s": 0.6}, "tables": {"requests": "a", "steps": "c"}}
    assert ab.differences(same, other) == ["ttft_p50_s", "steps table"]
    bench = script("bench_plan_speed.py")
    everything = bench.grid(len(bench.space()))
    tp1 = ab.grid_indices([1])
    assert tp1 == [i for i, d in enumerate(everything) if d.tp_size == 1] and len(tp1) == len(everything) // 2
    assert ab.grid_indices(None) == list(range(len(everything)))


@pytest.mark.slow  # a benchmark run; tests/sim/test_fast_forward*.py hold both paths to the same tables by default
def test_bench_sim_speed_runs_both_paths_alternating_and_checks_their_tables(monkeypatch):
    bench = script("bench_sim_speed.py")
    monkeypatch.setitem(bench.CASES, "tiny", (TINY, 60.0, 1.0))
    order = []
    real = bench.time_case
    monkeypatch.setattr(bench, "time_case", lambda overrides, tables=None: order.append(overrides[-1])
                        or real(overrides, tables))
    rows = bench.time_sim_case("tiny", ("on", "off"), 2, {})
    assert order == ["backend.fast_forward=true", "backend.fast_forward=false"] * 3  # (untimed warm-ups first)
    assert [r["fast_forward"] for r in rows] == ["on", "off"] and rows[0]["speedup"] > 0
    assert rows[0]["requests"] == rows[1]["requests"] == 12 and rows[0]["steps"] == rows[1]["steps"]


def test_program_cliff_bins_the_engine_residual_and_the_model_wait_by_sequence_count():
    cliff = script("fidelity/cause/program_cliff.py")
    engine = pd.DataFrame({"num_seqs": [30, 31, 33, 33, 33, 40], "context": [2000.0] * 6,
                           "seconds": [1e-4, 3e-4, 2e-4, 4e-4, 9e-4, 1e-4]})
    simulated = pd.DataFrame({"num_seqs": [33, 40], "context": [1900.0, 2100.0], "seconds": [2.5e-4, 1e-4]})
    table = cliff.by_bin(engine, simulated)
    assert list(table.index) == ["(28, 32]", "(32, 33]", "(36, 40]"]  # in sequence order, empty bins left out
    assert table.loc["(32, 33]", "engine_residual_ms"] == 0.4 and table.loc["(32, 33]", "engine_residual_steps"] == 3
    assert table.loc["(32, 33]", "model_wait_ms"] == 0.25 and pd.isna(table.loc["(28, 32]", "model_wait_ms"])


def test_sustained_probe_per_second_gives_each_shapes_seconds_and_their_clock():
    """sustained_probe.per_second: a shape's steps by whole second from its own start, each second's
    median span beside the clock samples that fell in it; another shape's seconds count from its own."""
    from experiments.fidelity.sustained_probe import per_second

    steps = pd.DataFrame({"shape": ["a"] * 4 + ["b"] * 2, "t_s": [0.0, 0.5, 1.2, 1.9, 5.0, 5.4],
                          "span_ms": [10.0, 12.0, 20.0, 22.0, 7.0, 9.0], "launch_ms": 1.0})
    clocks = pd.DataFrame({"t_s": [0.1, 1.5, 5.2, 9.0], "sm_mhz": [1980.0, 1700.0, 1900.0, 1.0],
                           "power_w": [600.0, 690.0, 500.0, 1.0], "temp_c": [50.0, 60.0, 55.0, 99.0]})
    table = per_second(steps, clocks)
    assert table[["shape", "second", "steps"]].values.tolist() == [["a", 0, 2], ["a", 1, 2], ["b", 0, 2]]
    assert table["span_ms"].tolist() == [11.0, 21.0, 8.0]
    assert table["sm_mhz"].tolist() == [1980.0, 1700.0, 1900.0] and table["power_w"].tolist() == [600.0, 690.0, 500.0]


def test_decode_excess_finds_a_constant_per_step_and_refuses_a_folder_without_replays(tmp_path, capsys):
    """Small decode graph steps measured 85 us over their price plus 3 us per 1,000 context tokens:
    the line gives both back; bigger batches, eager steps and prefills are left out."""
    excess = script("fidelity/cause/decode_excess.py")
    rng = np.random.default_rng(0)
    n = 400
    context = rng.integers(500, 40_000, n)
    seqs = rng.integers(1, 33, n)
    predicted = 1.5e-3 + 2e-8 * context
    steps = pd.DataFrame({"step": range(n), "kind": "decode", "cuda_graph": 1, "num_seqs": seqs,
                          "decode_context_tokens": context, "predicted_execute_profiled_s": predicted,
                          "measured_execute_s": predicted + 85e-6 + 3e-6 * context / 1000})
    others = pd.DataFrame({"step": [n, n + 1, n + 2], "kind": ["decode", "decode", "prefill"], "cuda_graph": [1, 0, 1],
                           "num_seqs": [64, 4, 2], "decode_context_tokens": [9000, 9000, 0],
                           "predicted_execute_profiled_s": 1e-3, "measured_execute_s": 9e-3})
    folder = tmp_path / "steps"
    folder.mkdir()
    pd.concat([steps, others]).to_csv(folder / "code_completion_0.8_1.csv.gz", index=False)
    assert excess.main([str(folder), "--out", str(tmp_path / "excess.csv")]) == 0
    row = pd.read_csv(tmp_path / "excess.csv").iloc[0]
    assert (str(row["load"]), int(row["repeat"]), int(row["steps"])) == ("0.8", 1, n)
    assert row["line_constant_s"] == pytest.approx(85e-6, rel=1e-6)
    assert row["line_per_1k_context_s"] == pytest.approx(3e-6, rel=1e-6)
    assert row["line_per_seq_s"] == pytest.approx(0.0, abs=1e-12)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert excess.main([str(empty), "--out", str(tmp_path / "x.csv")]) == 2
    assert "holds no replays" in capsys.readouterr().err


def test_decode_inputs_probe_times_each_shape_three_ways_on_the_tiny_model():
    """Every timed step ran (the placeholder plans take the previous step's samples on the engine),
    and a placeholder goes to decode entries only."""
    from engine.core.plan import PLACEHOLDER
    from harness.scripting import model_checkpoint, open_probe_engine, probe_plan

    probe = script("fidelity/decode_inputs_probe.py")
    executor, sched = open_probe_engine(model_checkpoint("tiny-qwen3"), 200, max_model_len=512, block_size=16,
                                        device="cpu")
    try:
        mixed = probe_plan(executor, sched, [(1, 40, True), (30, 0, False)])
        marked = probe.with_placeholders(mixed)
        assert [list(e.token_ids) == [PLACEHOLDER] for e in marked.scheduled] == [True, False]
        rows = pd.DataFrame(probe.probe_rows(executor, sched, shapes=((2, 60),), repeats=3))
    finally:
        executor.shutdown()
    assert rows.groupby("mode").size().to_dict() == {"grid": 12, "placeholders": 3, "placeholders, growing": 3}
    assert (rows["span_s"] > 0).all()
    assert "placeholders - grid" in probe.summarize(rows)


def test_grid_residuals_recover_a_steeper_context_price_at_one_sequence(tmp_path, capsys):
    """A fit with one context price for every batch, against grid rows whose single-sequence rows rise
    five times as fast: the slopes say so; a regime the grid lacks is refused in one line."""
    from sim.features import step_features
    from sim.profiled import ProfiledCostModel
    from tests.sim.helpers import decode_batch, plan, prefill
    from tests.sim.test_profiled import GRAPH

    residuals = script("fidelity/cause/grid_residuals.py")
    rows = []
    for batch in (1, 8, 64):
        for context in (200, 1000, 2000, 4000, 8000):
            features = step_features(decode_batch([context] * batch), GRAPH)
            per_token = 1e-7 if batch == 1 else 2e-8
            rows.append({**features, "duration_s": 1.5e-3 + per_token * features["decode_context_tokens"]})
    for tokens in (256, 1024, 4096):  # a profile needs prefill rows
        rows.append({**step_features(plan(prefill(tokens)), GRAPH), "duration_s": 1e-3 + 5e-7 * tokens})
    grid = pd.DataFrame(rows)
    grid.to_csv(tmp_path / "grid.csv", index=False)
    ProfiledCostModel.fit(grid, GRAPH).to_csv(tmp_path / "fit.csv")
    out = tmp_path / "residuals.csv"
    assert residuals.main([str(tmp_path / "grid.csv"), str(tmp_path / "fit.csv"), "--out", str(out)]) == 0
    slopes = residuals.slopes(pd.read_csv(out)).set_index("num_seqs")
    assert slopes.loc[1, "measured_s_per_token"] == pytest.approx(1e-7, rel=1e-6)
    assert slopes.loc[1, "priced_s_per_token"] < 0.5 * slopes.loc[1, "measured_s_per_token"]
    assert residuals.main([str(tmp_path / "grid.csv"), str(tmp_path / "fit.csv"), "--regime", "decode_eager",
                           "--out", str(out)]) == 2
    assert "no decode_eager rows" in capsys.readouterr().err


def test_prefill_load_bins_steps_by_the_prefill_the_run_computed_just_before():
    """Steps 1 ms each and no idle: the rate over the window before a step counts the prefill tokens
    of the steps that ended within it; a step after a burst of prefill lands in a higher bin."""
    load = script("fidelity/cause/prefill_load.py")
    steps = pd.DataFrame({"measured_execute_s": [0.001] * 6, "measured_host_s": [0.0] * 6,
                          "num_prefill_tokens": [0, 500, 500, 0, 0, 0]})
    ends, rate = load.recent_prefill_rate(steps, 0.002)
    assert ends == pytest.approx([0.001, 0.002, 0.003, 0.004, 0.005, 0.006])
    assert rate[2] == pytest.approx(1000 / 0.002)  # steps ending in (1, 3] ms: both prefills, over 2 ms
    assert rate[5] == pytest.approx(0.0)
    rows = pd.DataFrame({"regime": ["prefill_graph"] * 4, "measured_s": [1.0, 1.0, 1.1, 1.2],
                         "priced_s": [1.0, 1.0, 1.0, 1.0], "rate_k": [50, 60, 320, 330]})
    table = load.binned(rows).set_index("prefill_k_tokens_per_s")["measured_over_priced"]
    assert table.tolist() == pytest.approx([1.0, 1.15])


def test_prefill_rate_probe_summarises_each_mix_against_its_lightest():
    """Per shape and mix, the second half: prefill tokens a second, the median prefill span, the clock
    sampled then, and the span over the shape's lightest mix."""
    probe = script("fidelity/prefill_rate_probe.py")
    rows = []
    for decodes, span in ((4, 0.010), (0, 0.011)):
        t0 = 0.0 if decodes else 100.0
        cycle = [("prefill", span, 1000)] + [("decode", 0.002, 0)] * decodes
        for i in range(200):
            kind, s, tokens = cycle[i % len(cycle)]
            rows.append({"shape": "p", "decodes": decodes, "kind": kind, "t_s": t0 + 0.01 * i, "span_s": s,
                         "prefill_tokens": tokens})
    clocks = pd.DataFrame({"t_s": [1.5, 101.5], "sm_mhz": [1980.0, 1700.0], "power_w": [500.0, 690.0]})
    table = probe.summarize(pd.DataFrame(rows), clocks).set_index("decodes_per_prefill")
    assert table.loc[0, "prefill_k_tokens_per_s"] > table.loc[4, "prefill_k_tokens_per_s"]
    assert table.loc[4, "span_over_lightest"] == pytest.approx(1.0)
    assert table.loc[0, "span_over_lightest"] == pytest.approx(1.1)
    assert (table.loc[0, "sm_mhz"], table.loc[4, "power_w"]) == (1700.0, 500.0)
