"""End to end on the simulator: outputs, their invariants, and clock-independent schedules."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.output.metrics import read_steps
from harness.output.recording import StepRecorder
from harness.report import collect
from harness.report import main as report_main
from harness.run import run_once
from harness.study import run_study
from tests.core.fakes import OverlappingFakeExecutor
from tests.harness.conftest import compose_config

STEP_DECISIONS = ["kind", "requests", "prefill_tokens", "decode_tokens", "waiting", "running", "free_blocks",
                  "preempted", "prefix_hit_tokens", "repeated_kv_tokens"]
# A small cache under nano-vllm's bench: decodes run out of blocks and preempt.
PREEMPTING = ["workload.num_requests=64", "cache.num_blocks=40", "output.plots=false"]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("default")
    table = run_study(compose_config([]), out)
    return out, table.iloc[0]


def test_default_run_writes_tables_and_plots(default_run):
    out, _ = default_run
    for name in ("requests.csv", "steps.csv.gz", "summary.csv", "timeline.png", "latency_cdf.png"):
        assert (out / name).stat().st_size > 0, name
    requests = pd.read_csv(out / "requests.csv")
    assert list(requests.columns[:8]) == ["request_id", "arrival", "first_scheduled", "first_token", "finish",
                                          "ttft", "tpot", "e2e"]
    assert len(requests) == 256 and requests["request_id"].is_unique
    assert (requests["finish_reason"] == "length").all()


def _check_invariants(out, summary):
    requests = pd.read_csv(out / "requests.csv")
    steps = read_steps(out)
    assert requests["request_id"].is_unique and len(requests) == summary["num_requests"]
    assert (requests["ttft"] <= requests["e2e"] + 1e-12).all()
    assert (requests["arrival"] <= requests["first_scheduled"]).all()
    assert (requests["first_scheduled"] <= requests["first_token"]).all()
    makespan = summary["makespan_s"]
    assert makespan == pytest.approx(requests["finish"].max())
    assert summary["output_tok_s"] == pytest.approx(requests["output_tokens"].sum() / makespan)
    assert summary["input_tok_s"] == pytest.approx(requests["prompt_tokens"].sum() / makespan)
    assert summary["request_s"] == pytest.approx(len(requests) / makespan)
    assert steps["preempted"].sum() == requests["preemptions"].sum() == summary["preemptions"]
    assert steps["prefix_hit_tokens"].sum() == requests["cached_tokens"].sum()
    assert summary["ttft_p90_s"] == pytest.approx(np.percentile(requests["ttft"], 90))
    # nano: each decode entry samples one token, and so does the last prefill chunk of every
    # admission (the first one and each re-admission after a preemption)
    sampled = steps["decode_tokens"].sum() + len(requests) + summary["preemptions"]
    assert requests["output_tokens"].sum() == sampled


def test_default_run_invariants(default_run):
    _check_invariants(*default_run)


def test_invariants_hold_when_preempting(tmp_path):
    table = run_study(compose_config(PREEMPTING), tmp_path)
    summary = table.iloc[0]
    assert summary["preemptions"] > 0 and summary["recomputed_tokens"] > 0
    _check_invariants(tmp_path, summary)


def test_online_run_invariants(tmp_path):
    table = run_study(compose_config(["workload=poisson", "workload.num_requests=80", "workload.rate=40",
                                      "output.plots=false"]), tmp_path)
    _check_invariants(tmp_path, table.iloc[0])
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert requests["arrival"].max() > 0


@pytest.mark.parametrize("policy", ["nano", "mixed"])
def test_sim_and_fake_engine_make_the_same_schedule(policy):
    # Offline: decisions depend on the order of events, never on how long a step took.
    rc = build_run_config(compose_config([f"scheduler={policy}", "workload=shared_prefix", "workload.arrival=offline",
                                          "workload.rate=null", "workload.num_requests=96", "cache.num_blocks=60",
                                          "scheduler.max_num_batched_tokens=2048"]))
    sim = run_once(rc, progress=False)
    # the simulator overlaps steps by default (as the engine on CUDA): so does the fake
    fake = run_once(rc, progress=False,
                    executor=OverlappingFakeExecutor(60, rc.cache.block_size, vocab_size=rc.model.vocab_size))
    assert rc.sim.execution.async_scheduling is None
    assert sim.summary["preemptions"] > 0 and sim.summary["cached_tokens"] > 0  # the schedule is not trivial
    pd.testing.assert_frame_equal(sim.steps[STEP_DECISIONS], fake.steps[STEP_DECISIONS])
    assert not np.allclose(sim.steps["duration"], fake.steps["duration"])  # only the clocks differ


def test_rejected_requests_are_counted(tmp_path):
    # 2 blocks of 256 tokens cannot hold a 1,000-token request: those are rejected, the rest served.
    table = run_study(compose_config(["workload.num_requests=30", "cache.num_blocks=2", "output.plots=false"]),
                      tmp_path)
    summary = table.iloc[0]
    assert summary["num_rejected"] > 0
    assert summary["num_requests"] + summary["num_rejected"] == 30
    assert len(pd.read_csv(tmp_path / "rejected.csv")) == summary["num_rejected"]


def test_sweep_writes_one_row_per_value_and_a_curve(tmp_path):
    cfg = compose_config(PREEMPTING + ["study.kind=sweep", "study.param=cache.num_blocks", "study.values=[24,48,400]"])
    table = run_study(cfg, tmp_path)
    assert table["value"].tolist() == [24, 48, 400] and table["num_blocks"].tolist() == [24, 48, 400]
    assert table["preemptions"].iloc[0] > table["preemptions"].iloc[-1] == 0
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert len(pd.read_csv(tmp_path / "sweep.csv")) == 3
    assert sorted(p.name for p in (tmp_path / "points").iterdir()) == ["num_blocks=24", "num_blocks=400",
                                                                        "num_blocks=48"]
    # the report reads the points' summaries, not the same runs again from sweep.csv
    assert sorted(collect([tmp_path])["num_blocks"]) == [24, 48, 400]


def test_capacity_search_brackets_the_slo(tmp_path):
    # A small cache makes the queue grow once the rate is too high (otherwise 60 requests are one burst).
    cfg = compose_config(["workload=poisson", "workload.num_requests=60", "cache.num_blocks=40", "study.kind=capacity",
                          "+study.capacity={ttft_slo_s: 0.3, tpot_slo_s: 0.02, rel_tol: 0.1}"])
    table = run_study(cfg, tmp_path)
    probes = pd.read_csv(tmp_path / "capacity_probes.csv")
    capacity = table["capacity_req_s"].iloc[0]
    passing = probes[probes["meets_slo"]]
    failing = probes[~probes["meets_slo"]]
    assert capacity > 0 and capacity == passing["rate"].max() and not table["slo_met_offline"].iloc[0]
    above = failing[failing["rate"] > capacity]["rate"]
    assert len(above) and (above.min() - capacity) / above.min() <= 0.1
    assert (tmp_path / "capacity.png").stat().st_size > 0


def test_a_workload_that_meets_the_slo_offline_has_unbounded_capacity(tmp_path, caplog):
    # 8 requests all at once meet a loose SLO: every rate would, so no rate is searched
    cfg = compose_config(["workload=poisson", "workload.num_requests=8", "study.kind=capacity",
                          "+study.capacity={ttft_slo_s: 10, tpot_slo_s: 1}"])
    table = run_study(cfg, tmp_path)
    row = table.iloc[0]
    assert row["capacity_req_s"] == float("inf") and row["slo_met_offline"] and row["num_probes"] == 0
    assert pd.read_csv(tmp_path / "capacity.csv")["capacity_req_s"].iloc[0] == float("inf")
    assert "too small to bound the rate" in caplog.text
    assert (tmp_path / "capacity.png").stat().st_size > 0


def test_report_collects_runs(default_run, tmp_path):
    out, _ = default_run
    other = tmp_path / "other"
    run_study(compose_config(["scheduler=mixed", "output.plots=false"]), other)
    table = collect([out, other])
    assert sorted(table["policy"]) == ["mixed", "nano"]
    assert len(collect([out, out])) == 1  # a folder given twice counts once
    assert report_main([str(out), str(other), "--out", str(tmp_path / "report")]) == 0
    assert len(pd.read_csv(tmp_path / "report" / "report.csv")) == 2
    assert (tmp_path / "report" / "report.png").stat().st_size > 0


def test_bench_prints_output_tokens_over_simulated_time(tmp_path, capsys):
    table = run_study(compose_config(["experiment=bench", "output.plots=false", "workload.num_requests=32"]), tmp_path)
    row = table.iloc[0]
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("bench:")]
    assert line == [f"bench: {row['output_tokens']} output tokens in {row['makespan_s']:.2f} s (simulated time): "
                    f"{row['output_tokens'] / row['makespan_s']:.2f} tok/s"]


def test_capacity_search_with_nothing_served_is_a_config_error(tmp_path):
    # one block holds no request: the offline throughput that starts the bracket does not exist
    cfg = compose_config(["workload=poisson", "workload.num_requests=5", "cache.num_blocks=1", "study.kind=capacity",
                          "+study.capacity={}", "output.plots=false"])
    with pytest.raises(ConfigError, match="all 5 requests were rejected at admission"):
        run_study(cfg, tmp_path)


def test_report_keeps_identical_runs_and_sweeps_without_points(tmp_path):
    quick = ["workload.num_requests=8", "output.plots=false"]
    for name in ("a", "b"):  # the same configuration twice: two runs, two rows
        run_study(compose_config(quick), tmp_path / name)
    sweep = ["study.kind=sweep", "study.param=scheduler.policy", "study.values=[nano,mixed]",
             "output.point_outputs=false"]
    run_study(compose_config(quick + sweep), tmp_path / "sweep")
    table = collect([tmp_path])
    assert len(table) == 4
    assert sorted(table["run"].str.rsplit("/", n=1).str[-1]) == ["a", "b", "sweep[scheduler.policy=mixed]",
                                                                 "sweep[scheduler.policy=nano]"]


def test_a_shared_executor_stops_calling_a_finished_runs_recorder(monkeypatch):
    # The held-out protocol serves dozens of recorded runs on one loaded engine; a recorder left
    # watching would cost every later step its host time once per earlier run.
    rc = build_run_config(compose_config(["workload.num_requests=12", "workload.arrival=offline",
                                          "workload.rate=null"]))
    shared = OverlappingFakeExecutor(400, rc.cache.block_size, vocab_size=rc.model.vocab_size)
    recorded = []
    record_step = StepRecorder.__call__
    monkeypatch.setattr(StepRecorder, "__call__",
                        lambda self, *step: (recorded.append(id(self)), record_step(self, *step)))
    watched = []
    shared.observe(lambda plan, result, timing: watched.append(plan.stats.step))
    runs = [run_once(rc, progress=False, executor=shared, record=True) for _ in range(3)]
    steps = len(runs[0].steps)
    assert steps > 1 and [len(run.steps) for run in runs] == [steps] * 3
    assert len(recorded) == 3 * steps and len(set(recorded)) == 3  # each step recorded once, by its run
    assert len(watched) == 3 * steps  # a hook registered outside the runs keeps watching
    seen = []
    stop = shared.observe(lambda plan, result, timing: seen.append(plan.stats.step))
    run_once(rc, progress=False, executor=shared, record=False)
    stop()
    stop()  # a second call does nothing
    run_once(rc, progress=False, executor=shared, record=False)
    assert seen == list(range(steps))
