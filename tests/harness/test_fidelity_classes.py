"""The held-out protocol's workload classes and settings (no engine needed)."""

from __future__ import annotations

import numpy as np
import pytest

from harness.config import build_run_config
from harness.fidelity.classes import (
    CLASSES,
    CODE_COMPLETION,
    PREEMPT_OVERSUBSCRIPTION,
    CodeCompletionShape,
    class_run_config,
    max_model_len,
    preempting_pool_blocks,
    trace_rate,
    with_rate,
)
from harness.fidelity.study import FidelityConfig
from harness.run import run_once
from harness.workloads import build_workload
from tests.harness.conftest import compose_config


@pytest.fixture(scope="module")
def rc():
    return build_run_config(compose_config(["scheduler.max_model_len=16384"]))


def test_conversation_replays_the_traces_arrivals_at_the_asked_rate(rc):
    base = class_run_config(rc, "conversation", 300, 1.0, 400)
    cell = with_rate(base, "conversation", 12.0)
    arrivals = np.array([r.arrival_time for r in build_workload(cell.workload, 16384).requests])
    assert cell.workload.arrival == "trace" and cell.workload.prompt_len.dist == "trace"
    assert (len(arrivals) - 1) / np.ptp(arrivals) == pytest.approx(12.0, rel=1e-6)
    assert trace_rate(base.workload) == pytest.approx(12.0 / cell.workload.rate_scale)


def test_each_class_has_its_shape(rc):
    prefill = class_run_config(rc, "prefill_heavy", 50, 1.0, 400).workload
    assert (prefill.prompt_len.low, prefill.prompt_len.high) == (2048, 8192)
    assert max_model_len(4096, 1.0) == 10240 and max_model_len(512, 1 / 16) == 640
    bursty = with_rate(class_run_config(rc, "bursty", 50, 1.0, 400), "bursty", 5.0).workload
    assert (bursty.arrival, bursty.cv, bursty.rate) == ("gamma", 4.0, 5.0)
    assert class_run_config(rc, "preempting_bench", 50, 1.0, 400).cache.num_blocks == 400
    shared = class_run_config(rc, "shared_prefix", 50, 0.5, 400).workload.shared_prefix
    assert shared.prefix_len == 512 and shared.fraction == 1.0
    for name in CLASSES:
        assert class_run_config(rc, name, 50, 1.0, 400).workload.arrival == "offline"  # the drain first


def test_code_completion_has_long_prompts_few_token_outputs_and_the_traces_bursts(rc):
    """Prompts of about 2,000 tokens up to 7,400, outputs mostly a few tokens with a long tail, the
    Azure trace's own (bursty) arrival times at the asked rate, and max_model_len 8,192."""
    base = class_run_config(rc, "code_completion", 1500, 1.0)
    assert base.scheduler.max_model_len == 8192 and base.workload.arrival == "offline"
    cell = with_rate(base, "code_completion", 40.0)
    assert cell.workload.arrival == "trace" and cell.workload.prompt_len.dist == "lognormal"
    requests = build_workload(cell.workload, cell.scheduler.max_model_len).requests
    prompts = np.array([r.num_prompt_tokens for r in requests])
    outputs = np.array([r.sampling_params.max_tokens for r in requests])
    arrivals = np.sort([r.arrival_time for r in requests])
    assert 1800 < prompts.mean() < 2200 and prompts.max() <= 7400
    assert 10 <= np.median(outputs) <= 30 and outputs.max() > 300 and outputs.max() <= 1900
    assert (len(arrivals) - 1) / np.ptp(arrivals) == pytest.approx(40.0, rel=1e-6)
    gaps = np.diff(arrivals)
    assert gaps.std() / gaps.mean() > 1.1  # burstier than Poisson (CV 1)


def test_code_completion_is_parametrised_and_scales(rc):
    shape = CodeCompletionShape(prompt_median=800.0, prompt_high=3000, output_median=6.0, max_model_len=4096)
    small = class_run_config(rc, "code_completion", 50, 1.0, code_completion=shape)
    assert small.workload.prompt_len.median == 800.0 and small.workload.prompt_len.high == 3000
    assert small.scheduler.max_model_len == 4096
    cpu = class_run_config(rc, "code_completion", 50, 1 / 16).workload
    assert cpu.prompt_len.high == round(CODE_COMPLETION.prompt_high / 16)
    assert cpu.output_len.low <= cpu.output_len.median <= cpu.output_len.high


@pytest.mark.parametrize("num_requests", [12, 40, 80, 256])
def test_the_preempting_bench_preempts_at_any_size_unless_its_pool_is_fixed(rc, num_requests):
    """Its own pool: the requests ask for PREEMPT_OVERSUBSCRIPTION times its blocks (a fixed
    400-block pool held all of 80 requests and preempted none), and the simulator drains it with
    preemptions; the longest request still fits alone. A given pool is kept as given."""
    cell = class_run_config(rc, "preempting_bench", num_requests, 1.0)
    pool, block = cell.cache.num_blocks, cell.cache.block_size
    assert pool == preempting_pool_blocks(num_requests, 1.0, block)
    requests = build_workload(cell.workload, 16384).requests
    demand = sum(-(-(len(r.prompt_token_ids) + r.sampling_params.max_tokens) // block) for r in requests)
    assert pool >= -(-(1024 + 1024) // block)
    assert demand / pool > PREEMPT_OVERSUBSCRIPTION - 1
    assert run_once(cell, False).summary["preemptions"] > 0
    assert class_run_config(rc, "preempting_bench", num_requests, 1.0, 400).cache.num_blocks == 400


@pytest.mark.parametrize("field, value", [("workloads", ("nope",)), ("loads", (0.0,)), ("repeats", 1),
                                          ("length_scale", 2.0), ("grid", "huge"), ("cost_models", ("vidur",))])
def test_bad_settings_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"fidelity.{field}"):
        FidelityConfig(**{field: value})


def test_no_loads_is_allowed_and_a_bad_load_is_named_in_one_line():
    assert FidelityConfig(loads=()).loads == ()  # an offline-only run
    with pytest.raises(ValueError) as error:
        FidelityConfig(loads=(0.5, 1.6))
    assert "\n" not in str(error.value) and "fidelity.loads" in str(error.value) and "[0.5, 1.6]" in str(error.value)
