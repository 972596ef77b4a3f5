"""The held-out protocol for a mixture-of-experts model: the routing skew measured from the engine's
expert counts on the grid and carried to every simulation, the profile's distinct-experts column
(harness.fidelity.routing), and experiments/fidelity/run_gpu.sh end to end on CPU with the tiny MoE
model and random weights (slow: a couple of minutes on two cores), as the device runs it for
Qwen3-30B-A3B."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.expert_counts import ExpertCounts
from harness.fidelity.routing import measured_skew, with_distinct_experts
from sim.moe import ExpertRouting
from sim.specs import ModelSpec, preset_fields

ROOT = Path(__file__).resolve().parents[2]
MOE = ModelSpec(**preset_fields("qwen3-30b-a3b"))
DENSE = ModelSpec(**preset_fields("qwen3-0.6b"))


def _skewed_counts(rng, skew: float, layers: int = 4, tokens: int = 20_000) -> ExpertCounts:
    """Token assignments of a top-8 router whose experts' popularity follows the Zipf law."""
    weights = np.arange(1, 129, dtype=float) ** -skew
    rows = [np.bincount(np.concatenate([rng.choice(128, 8, replace=False, p=weights / weights.sum())
                                        for _ in range(tokens // 8)]), minlength=128) for _ in range(layers)]
    return ExpertCounts(tuple(range(layers)), np.array(rows, dtype=np.int64))


def test_the_skew_is_fitted_to_the_engines_counts_and_written(tmp_path):
    counts = _skewed_counts(np.random.default_rng(0), 0.6)
    skew = measured_skew(None, counts, MOE, tmp_path)
    assert 0.3 < skew < 0.9  # sampling without replacement flattens the Zipf law a little
    assert pd.read_csv(tmp_path / "expert_counts.csv").tokens.sum() == counts.tokens.sum()


def test_a_given_skew_wins_and_no_counts_mean_uniform(tmp_path):
    counts = _skewed_counts(np.random.default_rng(1), 1.0, layers=1, tokens=800)
    assert measured_skew(0.25, counts, MOE, tmp_path) == 0.25
    assert measured_skew(None, None, MOE, tmp_path) == 0.0
    assert measured_skew(None, counts, DENSE, tmp_path) == 0.0
    assert not (tmp_path / "expert_counts.csv").exists()


def test_the_profile_gets_the_expected_distinct_experts_of_each_shape():
    table = pd.DataFrame({"num_tokens": [1, 4, 16, 64, 4096], "duration_s": [0.01] * 5})
    for skew in (0.0, 1.0):
        moe = with_distinct_experts(table, MOE, skew)
        want = [ExpertRouting(128, 8, skew).distinct(n) for n in table.num_tokens]
        assert moe.moe_distinct_experts.tolist() == pytest.approx(want)
    assert with_distinct_experts(table, MOE, 0.0).moe_distinct_experts.iloc[0] == pytest.approx(8.0)
    assert "moe_distinct_experts" not in with_distinct_experts(table, DENSE, 0.0)
    kept = table.assign(moe_distinct_experts=5.0)  # a profile that has the column (measured) keeps it
    measured = with_distinct_experts(kept, MOE, 1.0)
    assert (measured.moe_distinct_experts == 5.0).all()
    assert measured.moe_expected_experts.tolist() == pytest.approx([ExpertRouting(128, 8, 1.0).distinct(n)
                                                                    for n in table.num_tokens])


def test_simulations_take_the_skew_from_the_engine_side():
    from harness.compare.study import sim_run_config
    from harness.config import build_run_config
    from tests.harness.conftest import compose_config

    rc = build_run_config(compose_config(["model=qwen3-30b-a3b", "hardware=h100"]))
    meta = {"num_blocks": 100, "graph_batch_sizes": [1, 2], "prefill_graph_sizes": [], "async_scheduling": True}
    assert sim_run_config(rc, "roofline", None, meta).sim.moe_routing_skew == 0.0
    assert sim_run_config(rc, "roofline", None, {**meta, "moe_routing_skew": 0.4}).sim.moe_routing_skew == 0.4


@pytest.mark.slow
def test_run_gpu_sh_serves_the_moe_protocol_on_cpu(tmp_path):
    """The device script as the 30B call runs it, on the tiny MoE model: random weights, expert
    counts on, the grid profiled with the MoE column, three classes at 50% and 80% load."""
    env = dict(os.environ, OUT=str(tmp_path / "out"), RUN_DIR=str(tmp_path / "run"), MODEL="tiny-qwen3-moe",
               HARDWARE="cpu", WHEELS="none", MAX_MODEL_LEN="512", NUM_REQUESTS="3", LOADS="0.5,0.8",
               WORKLOADS="prefill_heavy,shared_prefix,bursty",
               EXTRA="backend.device=cpu cache.block_size=16 fidelity.length_scale=0.0625 fidelity.grid=quick "
                     "fidelity.interval.draws=2",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    run = subprocess.run(["bash", "experiments/fidelity/run_gpu.sh"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    model_dir = tmp_path / "out" / "tiny-qwen3-moe"
    table = pd.read_csv(model_dir / "prefill_heavy-shared_prefix-bursty" / "heldout.csv")
    assert list(dict.fromkeys(table.workload)) == ["prefill_heavy", "shared_prefix", "bursty"]
    assert set(table.load.astype(str)) == {"offline", "0.5", "0.8"}
    profile = pd.read_csv(model_dir / "profile.csv")
    # each row's distinct experts as its step touched them (whole experts per layer, averaged over
    # the MoE layers), the expectation beside them
    assert {"moe_distinct_experts", "moe_expected_experts"} <= set(profile.columns)
    assert (profile.moe_distinct_experts * 2).round(6).eq((profile.moe_distinct_experts * 2).round()).all()
    assert "random_shapes_expected" in set(pd.read_csv(model_dir / "validation.csv")["set"])
    assert "moe_distinct_experts" in set(pd.read_csv(model_dir / "profile_model.csv").name)
    assert pd.read_csv(model_dir / "expert_counts.csv").tokens.sum() > 0
    assert "routing skew" in (model_dir / "prefill_heavy-shared_prefix-bursty" / "run.log").read_text()


def _grid_rows(locality: float) -> pd.DataFrame:
    """Grid rows (one and several sequences, cached context, a decode batch) whose counts are the
    locality model's expectation, as an engine whose sequences route alike would record them."""
    from sim.moe_locality import SequenceRouting

    shapes = [(16, 0, 1, 0), (256, 0, 1, 0), (1024, 0, 4, 0), (512, 8, 9, 0), (0, 32, 32, 0), (64, 0, 1, 2048)]
    table = pd.DataFrame(shapes, columns=["num_prefill_tokens", "num_decode_tokens", "num_seqs",
                                          "prefill_context_tokens"])
    table = table.assign(num_tokens=table.num_prefill_tokens + table.num_decode_tokens, set="grid",
                         kind=["prefill", "prefill", "prefill", "mixed", "decode", "prefill"])
    routing = SequenceRouting(128, 8, 0.0, locality)
    counts = [routing.distinct([64])] * 5 + [100.0]  # placeholders, set below for the fitted rows
    sizes = [[16], [256], [256] * 4, [512] + [1] * 8, [1] * 32]
    counts[:5] = [routing.distinct(s) for s in sizes]
    return table.assign(moe_distinct_experts=counts, moe_expected_experts=0.0)


def test_the_locality_is_fitted_to_the_grids_per_step_counts():
    from harness.fidelity.routing import measured_locality

    table = _grid_rows(2.0)
    # the cached-context row (100 experts, far from the model) is left out of the fit
    assert measured_locality(None, table, MOE, 0.0) == pytest.approx(2.0, rel=0.02)
    assert measured_locality(0.5, table, MOE, 0.0) == 0.5
    assert measured_locality(None, table.drop(columns="moe_expected_experts"), MOE, 0.0) == 0.0  # no per-step counts
    assert measured_locality(None, table, DENSE, 0.0) == 0.0


def test_the_expectation_beside_the_counts_is_of_each_rows_sequences():
    table = _grid_rows(2.0)
    assert with_distinct_experts(table, MOE, 0.0, 0.0) is table  # locality 0: the table as it was
    local = with_distinct_experts(table, MOE, 0.0, 2.0)
    assert local["moe_distinct_experts"].tolist() == table["moe_distinct_experts"].tolist()  # the counts stay
    assert local["moe_expected_experts"].iloc[:5].tolist() == pytest.approx(table["moe_distinct_experts"].iloc[:5])
