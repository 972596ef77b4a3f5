"""The memory planner's arithmetic, by hand, and its errors."""

from __future__ import annotations

import dataclasses

import pytest

from sim.memory import RUNTIME_RESERVE_BYTES, estimate_activation_bytes, plan_num_blocks
from tests.sim.helpers import hardware, model


def test_qwen3_8b_on_h100_by_hand():
    # Qwen3-8B, bf16: embedding and untied LM head 151936 x 4096 each; per layer q and o 4096 x 4096,
    # k and v 4096 x 1024, gate/up/down 3 x 4096 x 12288, two RMSNorms of 4096 and q/k norms of 128;
    # a final norm.
    params = 2 * 151936 * 4096 + 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128) + 4096
    assert params == 8_190_735_360
    weights = 2 * params
    block = 256 * (2 * 36 * 8 * 128 * 2)  # K and V, 36 layers, 8 KV heads of 128, bf16
    mem = 85_017_493_504  # H100 80GB as torch.cuda.mem_get_info() reports it
    reserve = 2 * 10**9
    expected = int((mem * 0.9 - weights - reserve) // block)
    assert expected == 1540  # 58.13 GB left for KV / 37.7 MB per block
    assert plan_num_blocks(model("qwen3-8b"), hardware("h100"), 256, 0.9, reserve) == expected


def test_tensor_parallel_halves_weights_and_kv_per_rank():
    spec, hw = model("qwen3-8b"), hardware("h100")
    one = plan_num_blocks(spec, hw, 256, 0.9, 0)
    two = plan_num_blocks(spec, hw, 256, 0.9, 0, tp_size=2)
    free_two = hw.mem_bytes * 0.9 - spec.weight_bytes_per_rank(2)
    assert two == int(free_two // (256 * spec.kv_bytes_per_token // 2))
    assert two > 2 * one  # half the KV per block and half the weights in the way


def test_default_activation_reserve_grows_with_the_token_budget():
    spec, hw = model("qwen3-0.6b"), hardware("h100")
    small = estimate_activation_bytes(spec, 2048, 256)
    large = estimate_activation_bytes(spec, 16384, 256)
    assert RUNTIME_RESERVE_BYTES < small < large
    # the MLP's widest point: gate/up, activation, residual and normed copy, bf16
    assert large - small == (16384 - 2048) * (3 * 3072 + 2 * 1024) * 2
    default = estimate_activation_bytes(spec, 16384, 512)  # plan_num_blocks' default budgets
    assert plan_num_blocks(spec, hw, 256) == plan_num_blocks(spec, hw, 256, activation_reserve_bytes=default)
    assert plan_num_blocks(spec, hw, 256, max_num_batched_tokens=2048) > plan_num_blocks(spec, hw, 256)


def test_weights_that_do_not_fit_raise_with_the_numbers():
    tiny_gpu = dataclasses.replace(hardware("h100"), name="tiny-gpu", mem_bytes=16 * 2**30)
    with pytest.raises(ValueError, match=r"qwen3-32b does not fit on tiny-gpu .* 65\.\d\d GB weights"):
        plan_num_blocks(model("qwen3-32b"), tiny_gpu, 256)


@pytest.mark.parametrize("kwargs, field", [
    ({"block_size": 0}, "block_size"), ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"activation_reserve_bytes": -1}, "activation_reserve_bytes"), ({"tp_size": 3}, "tp_size"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    args = {"block_size": 256, **kwargs}
    with pytest.raises(ValueError, match=field):
        plan_num_blocks(model("qwen3-8b"), hardware("h100"), **args)
