"""Pricing of mixture-of-experts models: parameters against the published figures, the memory
planner counting every expert, the roofline's expert phase, the profiled model's MoE column, and
dense models priced exactly as before."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from sim.config import SimConfig
from sim.cost_model import make_cost_model
from sim.memory import plan_num_blocks
from sim.moe import GROUPED_GEMM_BLOCK_M, expected_distinct_experts
from sim.profiled import ProfiledCostModel
from sim.roofline import RooflineCostModel
from sim.specs import ModelSpec
from tests.sim.helpers import decode, hardware, model, plan

_QWEN3 = dict(model_type="qwen3_moe", vocab_size=151936, head_dim=128, num_kv_heads=4,
              max_position_embeddings=40960, rope_theta=1_000_000.0, num_experts=128, num_experts_per_tok=8)
# Qwen's published config.json of Qwen3-30B-A3B and Qwen3-235B-A22B
A3B = ModelSpec(name="qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_heads=32, intermediate_size=6144,
                moe_intermediate_size=768, **_QWEN3)
A22B = ModelSpec(name="qwen3-235b-a22b", num_layers=94, hidden_size=4096, num_heads=64, intermediate_size=12288,
                 moe_intermediate_size=1536, **_QWEN3)


@pytest.mark.parametrize(("spec", "total", "active"), [(A3B, 30.5e9, 3.3e9), (A22B, 235e9, 22e9)])
def test_parameters_match_the_published_figures(spec: ModelSpec, total: float, active: float) -> None:
    # the model cards: "30.5B in total and 3.3B activated", "235B in total and 22B activated"
    assert spec.num_params == pytest.approx(total, rel=0.02)
    assert spec.active_params == pytest.approx(active, rel=0.03)
    assert spec.weight_bytes == 2 * spec.num_params  # bf16, every expert


def test_dense_models_keep_their_counts() -> None:
    for name in ("qwen3-0.6b", "qwen3-8b", "qwen3-32b"):
        spec = model(name)
        assert spec.active_params == spec.num_params
        for tp in (1, 2, 4):
            assert spec.body_params_per_rank(tp) == spec.num_layers * (
                spec.layer_linear_params(tp) + 2 * spec.hidden_size + 2 * spec.head_dim) + spec.hidden_size


def test_memory_planner_counts_every_expert() -> None:
    h200 = hardware("h200")
    with pytest.raises(ValueError, match=r"qwen3-235b-a22b does not fit on H200.*tp_size=1: .* 470\.\d+ GB weights"):
        plan_num_blocks(A22B, h200, 16, tp_size=1)
    assert plan_num_blocks(A22B, h200, 16, tp_size=8) > 1000
    # 30B-A3B: its 61 GB of experts fit one H200, leaving the rest to the KV cache
    blocks = plan_num_blocks(A3B, h200, 16)
    free = h200.mem_bytes * 0.9 - A3B.weight_bytes
    assert blocks * 16 * A3B.kv_bytes_per_token < free
    assert A3B.weight_bytes == pytest.approx(61.06e9, rel=1e-3)


def test_tp_shards_each_expert() -> None:
    assert A22B.weight_bytes_per_rank(8) == pytest.approx(A22B.weight_bytes / 8, rel=0.02)
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        replace(A3B, moe_intermediate_size=770).check_tp(4)


def _decode_step(cost: RooflineCostModel, batch: int, context: int = 512) -> float:
    return cost.time_for(batch, batch, batch * context, batch * (context + 1), batch)


def test_decode_grows_until_every_expert_is_touched_then_follows_the_dense_curve() -> None:
    cost = RooflineCostModel(A3B, hardware("h200"))
    bw = cost._bandwidth
    expert_bytes = A3B.num_moe_layers * A3B.expert_params() * A3B.dtype_bytes
    times = {b: _decode_step(cost, b) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048)}
    # small batches: each further token brings experts whose weights dominate the step
    for small, large in ((1, 2), (2, 4), (4, 8), (8, 16)):
        extra = expected_distinct_experts(large, 128, 8) - expected_distinct_experts(small, 128, 8)
        assert times[large] - times[small] >= 0.9 * extra * expert_bytes / bw
    # the marginal cost of a token shrinks while the experts saturate (concave)
    assert (times[4] - times[2]) / 2 > (times[256] - times[128]) / 128
    # saturated: every expert read, and the step grows by the per-token costs alone (weights
    # fixed), linearly like a dense model's memory-bound decode
    phases = cost.phase_times(1024, 1024, 0, 1024, 1024)
    assert phases["experts"] >= 128 * expert_bytes / bw * 0.999
    slope = (times[2048] - times[1024]) / 1024
    assert (_decode_step(cost, 1536) - times[1024]) / 512 == pytest.approx(slope, rel=1e-6)
    assert slope < (times[2] - times[1]) / 20


def test_skew_makes_small_batches_cheaper() -> None:
    uniform = RooflineCostModel(A3B, hardware("h200"))
    skewed = RooflineCostModel(A3B, hardware("h200"), routing_skew=1.0)
    assert _decode_step(skewed, 1) == pytest.approx(_decode_step(uniform, 1))
    assert _decode_step(skewed, 32) < 0.9 * _decode_step(uniform, 32)
    assert _decode_step(skewed, 100_000) == pytest.approx(_decode_step(uniform, 100_000), rel=1e-3)


def test_grouped_gemm_pads_each_expert_to_a_tile() -> None:
    cost = RooflineCostModel(A3B, hardware("h200"))
    tokens = 8192  # a long prefill: every expert gets ~512 rows, compute-bound
    padded = 128 * GROUPED_GEMM_BLOCK_M * np.ceil(tokens * 8 / 128 / GROUPED_GEMM_BLOCK_M)
    flops = 2 * padded * A3B.num_moe_layers * A3B.expert_params()
    assert cost.phase_times(tokens, 1, 0, 0, 1)["experts"] == pytest.approx(flops / cost._matmul_rate, rel=1e-6)


def test_tp_halves_the_experts() -> None:
    one, two = RooflineCostModel(A3B, hardware("h200")), RooflineCostModel(A3B, hardware("h200"), 2)
    assert two.phase_times(16, 16, 0, 16, 16)["experts"] == pytest.approx(
        one.phase_times(16, 16, 0, 16, 16)["experts"] / 2, rel=0.02)


# RooflineCostModel(model, hardware("h100"), tp).time_for(...) before mixture-of-experts pricing
PINNED = {("qwen3-8b", 1): (0.006059609381663113, 0.00994105722814499, 0.040646031516353744),
          ("qwen3-32b", 2): (0.01320402799536154, 0.01742542846220028, 0.10899621831511509),
          ("qwen3-0.6b", 2): (0.001890305103056148, 0.0038163928642501775, 0.005313419390431958)}
PINNED_BLOCKS = {("qwen3-8b", 1): 24371, ("qwen3-32b", 2): 19698, ("qwen3-0.6b", 2): 81583}


@pytest.mark.parametrize(("name", "tp"), PINNED)
def test_dense_models_price_exactly_as_before(name: str, tp: int) -> None:
    cost = RooflineCostModel(model(name), hardware("h100"), tp)
    steps = [(1, 1, 100, 101, 1), (64, 64, 64000, 64064, 64), (2048, 1, 0, 2048 * 2049 // 2, 1)]
    assert tuple(cost.time_for(*s) for s in steps) == PINNED[(name, tp)]
    assert plan_num_blocks(model(name), hardware("h100"), 16, tp_size=tp) == PINNED_BLOCKS[(name, tp)]
    assert "experts" not in cost.phase_times(*steps[0])


def _moe_profile(path: str, rng: np.random.Generator) -> None:
    """Decode steps whose measured distinct experts vary about their expectation (as an engine's
    counts do): duration = 1 ms + 20 us per sequence + 150 us per touched expert (above its weights'
    read at an H200's bandwidth, the floor of a decode step: sim.moe.WeightReadFloor) + KV reads."""
    rows = []
    for batch in rng.integers(1, 256, 300):
        distinct = min(128.0, expected_distinct_experts(int(batch), 128, 8) * rng.uniform(0.8, 1.2))
        context = int(batch) * 600
        rows.append(dict(num_prefill_tokens=0, num_decode_tokens=batch, num_seqs=batch, prefill_context_tokens=0,
                         decode_context_tokens=context, moe_distinct_experts=distinct,
                         duration_s=1e-3 + 2e-5 * batch + 1.5e-4 * distinct + 1e-9 * context))
    rows.append(dict(num_prefill_tokens=512, num_decode_tokens=0, num_seqs=1, prefill_context_tokens=0,
                     decode_context_tokens=0, moe_distinct_experts=128.0, duration_s=0.02))
    pd.DataFrame(rows).to_csv(path, index=False)


def test_profiled_model_learns_the_price_of_an_expert(tmp_path) -> None:
    path = str(tmp_path / "moe.csv")
    _moe_profile(path, np.random.default_rng(0))
    sim = SimConfig(cost_model="profiled", profile_path=path)
    cost = make_cost_model(A3B, hardware("h200"), sim)
    assert isinstance(cost, ProfiledCostModel) and cost.uses_moe_features
    fit = cost.fits["decode_eager"]
    assert dict(zip(fit.linear_features, fit.linear_coefs))["moe_distinct_experts"] == pytest.approx(1.5e-4, rel=0.05)
    step = plan(*(decode(600, rid=str(i)) for i in range(16)))
    expected = 1e-3 + 2e-5 * 16 + 1.5e-4 * expected_distinct_experts(16, 128, 8) + 1e-9 * 16 * 601
    assert cost.step_time(step) == pytest.approx(expected, rel=0.02)
    # saved coefficients keep the column
    cost.to_csv(tmp_path / "coefficients.csv")
    again = ProfiledCostModel.load(tmp_path / "coefficients.csv")
    again.distinct_experts = cost.distinct_experts
    assert again.step_time(step) == pytest.approx(cost.step_time(step), rel=1e-9)
    with pytest.raises(ValueError, match="mixture-of-experts model"):
        make_cost_model(model("qwen3-8b"), hardware("h200"), sim)


def test_bad_skew_is_one_line() -> None:
    for bad in (-0.1, float("nan"), 9.0, True):
        with pytest.raises(ValueError, match="SimConfig.moe_routing_skew"):
            SimConfig(moe_routing_skew=bad)
