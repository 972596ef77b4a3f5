"""backend.kv_scatter: a disaggregated decode replica's device writes each landed request's KV from
its receive staging into the paged cache before its next step (hardware.kv_scatter_base_s,
kv_scatter_bandwidth), so that step is longer by base + the request's KV bytes / bandwidth."""

from __future__ import annotations

import pandas as pd
import pytest

from engine.core import CacheConfig, ExecutionConfig, SchedulerConfig
from engine.core.executor import BackendInfo
from harness.study import run_study
from sim import RooflineCostModel, SimConfig, SimExecutor, build_sim_executor
from sim import kv_scatter as kv_scatter_cost
from tests.harness.conftest import compose_config
from tests.sim.helpers import decode_batch, hardware, model, plan, prefill

BASE_S, TOKEN_S = 2e-4, 1e-7


def _executor() -> tuple[SimExecutor, RooflineCostModel]:
    cost = RooflineCostModel(model("qwen3-0.6b"), hardware("h200"))
    info = BackendInfo(1000, 16, 1000, overlaps_steps=True)
    return SimExecutor(cost, info, scatter=(BASE_S, TOKEN_S)), cost


def test_the_next_step_alone_pays_the_landed_writes():
    executor, cost = _executor()
    step = decode_batch([500] * 8)
    executor.landed(1000)
    executor.landed(3000)
    first = executor.submit(step).result().duration_s
    second = executor.submit(step).result().duration_s
    assert first == pytest.approx(cost.step_time(step) + 2 * BASE_S + 4000 * TOKEN_S)
    assert second == pytest.approx(cost.step_time(step))
    executor.landed(500)  # steps run one at a time pay it too
    assert executor.execute(plan(prefill(300))).duration_s == pytest.approx(
        cost.step_time(plan(prefill(300))) + BASE_S + 500 * TOKEN_S)


def test_the_price_is_the_hardwares_per_tp_rank_and_refused_without_figures():
    spec, h200 = model("qwen3-8b"), hardware("h200")
    on = SimConfig(kv_scatter=True)
    base, token_s = kv_scatter_cost(spec, h200, on, 2)
    assert base == h200.kv_scatter_base_s
    assert token_s == pytest.approx(spec.kv_bytes_per_token_per_rank(2) / h200.kv_scatter_bandwidth)
    assert kv_scatter_cost(spec, h200, SimConfig(), 1) == (0.0, 0.0)
    with pytest.raises(ValueError, match="hardware H100.* has no kv_scatter_base_s"):
        kv_scatter_cost(spec, hardware("h100"), on, 1)
    with pytest.raises(ValueError, match="SimConfig.kv_scatter must be true or false"):
        SimConfig(kv_scatter="yes")  # type: ignore[arg-type]


def test_a_landing_lengthens_the_decode_replicas_next_step_by_its_write(tmp_path):
    """Requests far apart: each lands on an idle decode replica, whose steps are otherwise the same,
    so its steps take exactly one write per request longer in all."""
    common = ["fleet=disaggregated", "hardware=h200", "workload=poisson", "workload.rate=0.5",
              "workload.num_requests=12", "workload.output_len.low=8", "workload.output_len.high=8",
              "workload.prompt_len.high=2000", "output.plots=false"]
    totals, prompts = {}, None
    for on in (False, True):
        out = tmp_path / str(on)
        run_study(compose_config([*common, f"backend.kv_scatter={str(on).lower()}"]), out)
        steps = pd.read_csv(out / "steps.csv.gz" if (out / "steps.csv.gz").exists() else out / "steps.csv")
        totals[on] = steps.loc[steps["pool"] == "decode", "duration"].sum()
        prompts = pd.read_csv(out / "requests.csv")["prompt_tokens"].sum()
    h200, spec = hardware("h200"), model("qwen3-0.6b")
    write = 12 * h200.kv_scatter_base_s + prompts * spec.kv_bytes_per_token_per_rank(1) / h200.kv_scatter_bandwidth
    assert totals[True] - totals[False] == pytest.approx(write, rel=1e-6)


def test_build_sim_executor_prices_it_from_the_config():
    sim = SimConfig(kv_scatter=True, execution=ExecutionConfig(async_scheduling=True))
    executor = build_sim_executor(model("qwen3-0.6b"), hardware("h200"), sim, CacheConfig(block_size=16, num_blocks=64),
                                  SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096))
    assert executor.scatter_base_s == hardware("h200").kv_scatter_base_s and executor.scatter_token_s > 0
