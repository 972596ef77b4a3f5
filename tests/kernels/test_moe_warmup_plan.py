"""The fused-MoE warm-up plan on CPU (kernels.moe_configs.warmup_token_counts, engine.kv_sizing's
plans): one token count per launch variant, covering every variant a step of up to
max_num_batched_tokens tokens can take, and the route/align kernels left unspecialised on the
integer arguments that follow the token count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import SchedulerConfig
from engine.kv_sizing import moe_warmup_plans
from kernels.moe_configs import launch_variant, warmup_token_counts

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
QWEN3_30B = (8, 128, 768, "bfloat16")  # top_k, experts, per-rank intermediate, dtype: the tuned tables' shape


@pytest.mark.parametrize("device", [H100, H200, "cpu"])  # cpu: no table, the default tiles
@pytest.mark.parametrize("align_experts", [None, 65])  # 65: expert parallelism over two ranks
def test_plan_covers_every_variant_up_to_the_budget(device, align_experts):
    budget = SchedulerConfig().max_num_batched_tokens
    counts = warmup_token_counts(budget, *QWEN3_30B, device, align_experts)
    assert list(counts) == sorted(set(counts)) and 1 <= counts[0] and counts[-1] <= budget
    planned = [launch_variant(c, *QWEN3_30B, device, align_experts) for c in counts]
    assert len(set(planned)) == len(planned), "one count per variant"
    missing = [t for t in range(1, budget + 1) if launch_variant(t, *QWEN3_30B, device, align_experts) not in planned]
    assert not missing, f"token counts whose variant the plan skips: {missing[:10]}"


def test_the_h100_calls_stalled_steps_are_warmed():
    """The two eager prefills that compiled mid-run on an H100 (experiments/fidelity/h100_30b_r5):
    6,030 and 6,155 tokens now share a variant with a warm-up count."""
    counts = warmup_token_counts(16384, *QWEN3_30B, H100)
    planned = {launch_variant(c, *QWEN3_30B, H100) for c in counts}
    assert launch_variant(6030, *QWEN3_30B, H100) in planned
    assert launch_variant(6155, *QWEN3_30B, H100) in planned
    # the tile table's buckets 4096 (up to 6,144 tokens) and 8192 both appear
    assert {launch_variant(t, *QWEN3_30B, H100)[0].block_m for t in (6030, 6155)} == {128}


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3000), st.sampled_from([1, 2, 4, 6, 8]), st.sampled_from([8, 60, 128]))
def test_small_budgets_are_covered(budget, top_k, experts):
    counts = warmup_token_counts(budget, top_k, experts, 64, "float32", "cpu")
    planned = {launch_variant(c, top_k, experts, 64, "float32", "cpu") for c in counts}
    assert all(launch_variant(t, top_k, experts, 64, "float32", "cpu") in planned for t in range(1, budget + 1))


@pytest.mark.parametrize("bad", [0, -3, True, 2.5])
def test_bad_budget_is_refused(bad):
    with pytest.raises(ValueError, match="max_tokens"):
        warmup_token_counts(bad, *QWEN3_30B, H100)


def test_warmup_plans_prefill_each_count_within_max_model_len():
    config = SchedulerConfig(max_model_len=4096, max_num_batched_tokens=16384)
    counts = (1, 7, 4096, 6145, 16384)
    plans = moe_warmup_plans(config, 256, counts)
    assert [p.stats.num_prefill_tokens for p in plans] == list(counts)
    for plan, count in zip(plans, counts):
        lens = [len(e.token_ids) for e in plan.scheduled]
        assert not plan.use_cuda_graphs
        assert sum(lens) == count and max(lens) <= config.max_model_len
        assert len(lens) <= config.max_num_seqs


# every argument of these kernels that follows the step's token count (a divisibility-by-16 or
# equal-to-1 specialisation of any of them is a compile in the middle of a run)
TOKEN_INTS = {"kernels/moe_route.py": {"_route_kernel": {"num_tokens", "capacity"}},
              "kernels/moe_align_triton.py": {"_count_kernel": {"num_pairs", "capacity"},
                                              "_scan_kernel": {"num_rows"},
                                              "_scatter_kernel": {"num_pairs", "num_rows", "num_tiles"}},
              "kernels/fused_moe.py": {"_grouped_gemm_kernel": {"num_pairs"}}}


@pytest.mark.parametrize("path", sorted(TOKEN_INTS))
def test_token_count_arguments_are_not_specialised(path):
    root = Path(__file__).resolve().parents[2]
    tree = ast.parse((root / path).read_text())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in TOKEN_INTS[path]:
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call):
                    for kw in dec.keywords:
                        if kw.arg == "do_not_specialize":
                            found[node.name] = set(ast.literal_eval(kw.value))
    assert found == TOKEN_INTS[path]
