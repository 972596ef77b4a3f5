"""The planner and the fleet accept mixture-of-experts models: a model section with every field
(no preset) and the Qwen3-MoE fields, priced over tensor-parallel sizes."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.routers import RouterConfig
from harness.plan.config import SLOConfig, load_catalogue
from harness.plan.evaluate import PlanBase, evaluate
from harness.plan.row import Deployment
from harness.scripting import compose_run_config

ROOT = Path(__file__).resolve().parents[2]
# Qwen's published config.json of the two models, as a model section without a preset
_COMMON = ["model.preset=null", "+model.model_type=qwen3_moe", "+model.num_kv_heads=4", "+model.head_dim=128",
           "+model.vocab_size=151936", "+model.max_position_embeddings=40960", "+model.rope_theta=1000000.0",
           "+model.num_experts=128", "+model.num_experts_per_tok=8"]
A3B = [*_COMMON, "+model.name=qwen3-30b-a3b-test", "+model.num_layers=48", "+model.hidden_size=2048",
       "+model.num_heads=32", "+model.intermediate_size=6144", "+model.moe_intermediate_size=768"]
A22B = [*_COMMON, "+model.name=qwen3-235b-a22b-test", "+model.num_layers=94", "+model.hidden_size=4096",
        "+model.num_heads=64", "+model.intermediate_size=12288", "+model.moe_intermediate_size=1536"]
WORKLOAD = ["experiment=plan", "workload.num_requests=60", "workload.rate=5", "output.progress=false"]


def _evaluate(model: list[str], deployments: list[Deployment], extra: tuple[str, ...] = ()) -> list:
    logging.disable(logging.WARNING)
    try:
        base = PlanBase(compose_run_config([*WORKLOAD, *model, *extra]), load_catalogue(("h100", "h200")),
                        SLOConfig(), RouterConfig())
        return [evaluate(d, base) for d in deployments]
    finally:
        logging.disable(logging.NOTSET)


def test_235b_needs_eight_h200s() -> None:
    one, eight = _evaluate(A22B, [Deployment("h200", 1, 64, 2048, "nano", "round_robin", 1),
                                  Deployment("h200", 8, 64, 2048, "nano", "round_robin", 1)])
    assert "qwen3-235b-a22b-test does not fit on H200-SXM-141GB with tp_size=1" in one.error
    assert "\n" not in one.error and not one.meets_slo
    assert eight.error == "" and eight.measures.output_tok_s > 0


def test_30b_a3b_plans_over_tp_and_skew() -> None:
    rows = _evaluate(A3B, [Deployment("h100", 1, 64, 2048, "nano", "round_robin", 1),
                           Deployment("h100", 2, 64, 2048, "nano", "round_robin", 1)])
    assert all(r.error == "" for r in rows)
    assert rows[1].measures.tpot_p50_s < rows[0].measures.tpot_p50_s  # each rank reads half of each expert
    skewed, = _evaluate(A3B, [Deployment("h100", 1, 64, 2048, "nano", "round_robin", 1)],
                        ("backend.moe_routing_skew=1.0",))
    assert skewed.measures.tpot_p50_s < rows[0].measures.tpot_p50_s  # fewer distinct experts per step


@pytest.mark.slow
def test_the_command_runs_an_moe_model_on_the_azure_trace(tmp_path) -> None:
    """`python -m harness model=... hardware=h200 workload=trace_azure_conv`, the model given field by field."""
    result = subprocess.run([sys.executable, "-m", "harness", *A3B, "hardware=h200", "workload=trace_azure_conv",
                             "workload.num_requests=200", f"hydra.run.dir={tmp_path}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "model qwen3-30b-a3b-test | hardware H200-SXM-141GB" in result.stdout
