"""The simulator prices the KV cache the config stores (cache.kv_cache_dtype): an fp8 cache holds
twice the bf16 cache's tokens in the same memory, and a decode step reads half the KV bytes."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.config import CacheConfig, SchedulerConfig
from harness.convert import ConfigError
from harness.scripting import compose_run_config
from sim import build_sim_executor
from sim.config import SimConfig
from sim.roofline import RooflineCostModel
from tests.sim.helpers import decode_batch, hardware, model


@pytest.mark.parametrize("name", ["qwen3-0.6b", "qwen3-8b"])
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_an_fp8_cache_plans_twice_the_blocks_of_bf16(name, gpu):
    spec, hw = model(name), hardware(gpu)
    blocks = {dtype: build_sim_executor(spec, hw, SimConfig(), CacheConfig(kv_cache_dtype=dtype),
                                        SchedulerConfig()).info().num_blocks
              for dtype in ("auto", "fp8")}
    # the same bytes of cache in blocks half as large (the floor may lose one)
    assert blocks["fp8"] in (2 * blocks["auto"], 2 * blocks["auto"] + 1)


def test_an_fp8_cache_halves_the_roofline_attention_of_a_decode_step():
    hw = dataclasses.replace(hardware("h100"), step_overhead_s=0.0, seq_overhead_s=0.0)
    bf16, fp8 = model("qwen3-0.6b"), model("qwen3-0.6b").with_kv_cache("fp8")
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    contexts = [2000] * 128
    context_tokens = sum(contexts) + len(contexts)
    phases = {spec.kv_cache_dtype: RooflineCostModel(spec, hw).phase_times(128, 128, sum(contexts), context_tokens, 128)
              for spec in (bf16.with_kv_cache("auto"), fp8)}
    assert phases["fp8"]["attention"] == pytest.approx(phases["auto"]["attention"] / 2)
    assert RooflineCostModel(fp8, hw).step_time(decode_batch(contexts)) < \
        RooflineCostModel(bf16, hw).step_time(decode_batch(contexts))


def test_the_run_config_carries_the_cache_dtype_into_the_model_it_prices():
    assert compose_run_config(["cache.kv_cache_dtype=fp8"]).model.kv_bytes_per_token * 2 == \
        compose_run_config([]).model.kv_bytes_per_token
    with pytest.raises(ConfigError, match="cache.kv_cache_dtype"):
        compose_run_config(["+model.kv_cache_dtype=fp8"])
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        compose_run_config(["cache.kv_cache_dtype=int4"])
