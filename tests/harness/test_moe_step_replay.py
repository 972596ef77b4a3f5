"""The held-out protocol's per-step replays (fidelity.steps_dir, run_gpu.sh's STEPS=1) of a
mixture-of-experts model, the tiny MoE one: a served run's steps carry no per-step expert count
(the engine reads its counter back only for the profiling grid), so each step is priced with the
expected count of its tokens at the cell's routing skew, as the simulator prices its own steps, and
the replay says so (moe_experts_source); a table that has the engine's counts keeps them. Without
that, the profiled MoE fit found no moe_distinct_experts in the step and the replay failed."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from harness.calibration.expert_steps import ExpertTally
from harness.calibration.profiling import profile_executor
from harness.config import build_run_config
from harness.fidelity.routing import with_distinct_experts
from harness.fidelity.steps import MOE_SOURCE, expected_experts, predictors, write_replays
from harness.run import run_once
from sim.moe import ExpertRouting
from sim.profiled import ProfiledCostModel
from tests.harness.conftest import compose_config

SKEW = 0.4
SERVED = ["model=tiny-qwen3-moe", "hardware=h100", "workload.num_requests=6", "workload.prompt_len.low=20",
          "workload.prompt_len.high=96", "workload.output_len.low=4", "workload.output_len.high=12",
          "scheduler.max_model_len=256", "cache.block_size=16", "cache.num_blocks=64",
          "execution.async_scheduling=false"]
META = {"num_blocks": 64, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": False,
        "moe_routing_skew": SKEW}


def _replayed(tmp_path, rc, steps: pd.DataFrame, profile: str) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        priced = predictors(rc, ("profiled", "roofline"), profile, META)
        [path] = write_replays(tmp_path / "steps", "conversation", "0.5", [steps], priced,
                               expected_experts(rc, META))
    return pd.read_csv(path)


def _check_expected(replay: pd.DataFrame, rc) -> None:
    routing = ExpertRouting(rc.model.num_experts, rc.model.num_experts_per_tok, SKEW)
    assert (replay[MOE_SOURCE] == "expected").all()
    # a CUDA graph's padding rows route alike: one token more where a graph is larger than the step
    padded = (replay["cuda_graph"] == 1) & (replay["graph_batch_size"] > replay["num_tokens"])
    assert padded.any() and not padded.all()
    assert replay["moe_distinct_experts"].tolist() == pytest.approx([routing.distinct(int(n) + int(p))
                                                                     for n, p in zip(replay["num_tokens"], padded)])
    for name in ("profiled", "roofline"):
        assert np.isfinite(replay[f"predicted_{name}_s"]).all() and (replay[f"predicted_{name}_s"] > 0).all()


def test_a_simulated_moe_runs_steps_replay_with_the_expected_experts(tmp_path):
    """Fast: the steps of a simulated run (no count, as a served engine run), priced by a profile
    whose rows carry per-step counts that vary about the expectation."""
    rc = build_run_config(compose_config(SERVED))
    steps = run_once(rc, progress=False, record=True).steps.rename(columns={"duration": "duration_s"})
    rng = np.random.default_rng(0)
    routing = ExpertRouting(rc.model.num_experts, rc.model.num_experts_per_tok, SKEW)
    counts = np.array([routing.distinct(int(n)) for n in steps["num_tokens"]]) * rng.uniform(0.8, 1.0, len(steps))
    profile = tmp_path / "profile.csv"
    steps.assign(moe_distinct_experts=counts).to_csv(profile, index=False)
    assert "moe_distinct_experts" in set(pd.read_csv(profile).columns)

    served = steps.rename(columns={"duration_s": "duration"})
    replay = _replayed(tmp_path, rc, served, str(profile))
    _check_expected(replay, rc)
    # a table with the engine's own counts keeps them, and says so
    measured = _replayed(tmp_path, rc, served.assign(moe_distinct_experts=3.0), str(profile))
    assert (measured[MOE_SOURCE] == "measured").all() and (measured["moe_distinct_experts"] == 3.0).all()


def test_a_dense_runs_replay_has_no_moe_column(tmp_path):
    rc = build_run_config(compose_config([*SERVED[1:], "model=tiny-qwen3"]))
    assert expected_experts(rc, META) is None


def test_the_profiled_model_prices_a_table_without_the_column_by_the_expectation():
    table = pd.DataFrame({"num_prefill_tokens": [0, 0, 64], "num_decode_tokens": [1, 8, 0], "num_seqs": [1, 8, 1],
                          "prefill_context_tokens": 0, "decode_context_tokens": [100, 800, 0],
                          "duration_s": [1e-3, 2e-3, 3e-3], "moe_distinct_experts": [2.0, 6.0, 7.5]})
    grid = pd.concat([table.assign(duration_s=table.duration_s * f, moe_distinct_experts=table.moe_distinct_experts * f)
                      for f in (0.9, 1.0, 1.1)], ignore_index=True)
    model = ProfiledCostModel.fit(grid)
    with pytest.raises(ValueError, match="moe_distinct_experts"):
        model.predict(table.drop(columns="moe_distinct_experts"))
    model.distinct_experts = lambda sizes: {1: 2.0, 8: 6.0, 64: 7.5}[sum(sizes)]
    assert model.predict(table.drop(columns="moe_distinct_experts")) == pytest.approx(model.predict(table))


@pytest.mark.slow
def test_an_engine_runs_steps_replay_on_the_tiny_moe_model(tmp_path):
    """The device path on CPU: the tiny MoE engine (random weights) profiles a grid with its
    per-step counts, serves a run, and the run's steps replay under both cost models."""
    from engine import LLM
    from tests.harness.test_expert_steps import GRID

    llm = LLM("tiny-qwen3-moe", load_format="dummy", device="cpu", max_model_len=256, record_expert_counts=True)
    tally = ExpertTally.of(llm.executor)
    grid = profile_executor(llm.executor, llm.scheduler_config, GRID, experts=tally)
    llm.shutdown()
    rc = build_run_config(compose_config([*SERVED, "backend=engine", "backend.load_format=dummy",
                                          "backend.device=cpu"]))
    profile = tmp_path / "profile.csv"
    with_distinct_experts(grid, rc.model, SKEW).to_csv(profile, index=False)
    steps = run_once(rc, progress=False, record=True).steps
    assert "moe_distinct_experts" not in steps.columns
    _check_expected(_replayed(tmp_path, rc, steps, str(profile)), rc)
