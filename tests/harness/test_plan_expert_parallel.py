"""The planner searches expert parallelism for a mixture-of-experts model above TP 1, and plan.csv
says which placement each row priced; a dense model's search space and plan.csv are unchanged."""

from __future__ import annotations

import logging

import pytest

from engine.core.routers import RouterConfig
from harness.convert import ConfigError
from harness.plan.config import PlanConfig, SLOConfig, load_catalogue
from harness.plan.evaluate import PlanBase, evaluate
from harness.plan.row import Deployment
from harness.plan.search import configurations, search
from harness.scripting import compose_run_config

WORKLOAD = ["experiment=plan", "workload.num_requests=40", "workload.rate=5", "output.progress=false"]
SPACE = dict(hardware=("h100",), tp_sizes=(1, 2), max_num_seqs=(64,), policies=("nano",), routers=("round_robin",))


def _rc(model: str, *extra: str):
    logging.disable(logging.WARNING)
    try:
        return compose_run_config([*WORKLOAD, f"model={model}", *extra])
    finally:
        logging.disable(logging.NOTSET)


def test_moe_model_searches_both_placements_above_tp1() -> None:
    configs = configurations(PlanConfig(**SPACE), _rc("qwen3-30b-a3b"))
    assert [(d.tp_size, d.expert_parallel) for d in configs] == [(1, False), (2, False), (2, True)]
    only_sliced = configurations(PlanConfig(**SPACE, expert_parallel=(False,)), _rc("qwen3-30b-a3b"))
    assert [(d.tp_size, d.expert_parallel) for d in only_sliced] == [(1, False), (2, False)]


def test_dense_model_has_one_placement_and_no_column() -> None:
    configs = configurations(PlanConfig(**SPACE), _rc("qwen3-8b"))
    assert [(d.tp_size, d.expert_parallel) for d in configs] == [(1, None), (2, None)]
    rc = _rc("qwen3-8b")
    row = evaluate(configs[0], PlanBase(rc, load_catalogue(("h100",)), SLOConfig(), RouterConfig()))
    assert "expert_parallel" not in row.as_dict()


def test_plan_rows_price_each_placement() -> None:
    rc = _rc("qwen3-30b-a3b")
    base = PlanBase(rc, load_catalogue(("h100",)), SLOConfig(), RouterConfig())
    sliced, whole = (evaluate(Deployment("h100", 2, 64, 2048, "nano", "round_robin", 1, expert_parallel=ep), base)
                     for ep in (False, True))
    assert sliced.error == whole.error == ""
    assert sliced.as_dict()["expert_parallel"] is False and whole.as_dict()["expert_parallel"] is True
    # light load, small decode batches: the busiest rank reads more than half of the touched
    # experts at full width, so whole experts per rank decode more slowly (docs/moe-pricing.md)
    assert whole.measures.tpot_p50_s > sliced.measures.tpot_p50_s
    assert base.cost_per_hour(whole.deployment) == base.cost_per_hour(sliced.deployment)


def test_bad_expert_parallel_settings_fail_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"plan.expert_parallel\[0\] must be true or false"):
        PlanConfig(**SPACE, expert_parallel=("yes",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plan.expert_parallel must list at least one value"):
        PlanConfig(**SPACE, expert_parallel=())
    with pytest.raises((ValueError, ConfigError), match="expert_parallel=true needs a mixture-of-experts model"):
        from harness.run import make_executor

        make_executor(_rc("qwen3-8b", "execution.tensor_parallel_size=2", "execution.expert_parallel=true"))


def test_planner_picks_sliced_experts_where_the_engine_measured_them_faster() -> None:
    # 40 req/s on one TP=2 H200 replica: decode batches of a hundred and more, where the roofline
    # alone priced whole experts per rank 0.5-1% faster; the engine measured them 6-10% slower per
    # step there (experiments/moe/h200x2_ep_run2/, hardware.expert_parallel_* in conf/hardware/h200.yaml)
    rc = _rc("qwen3-30b-a3b", "workload.num_requests=200", "workload.rate=40")
    base = PlanBase(rc, load_catalogue(("h200",)), SLOConfig(), RouterConfig())
    sliced, whole = (evaluate(Deployment("h200", 2, 256, 8192, "nano", "round_robin", 1, expert_parallel=ep), base)
                     for ep in (False, True))
    assert whole.measures.tpot_p90_s > 1.05 * sliced.measures.tpot_p90_s
    # a TPOT target between the two: the search, offered whole experts first, plans sliced ones
    slo = SLOConfig(ttft_p90_s=2.0, tpot_p90_s=(sliced.measures.tpot_p90_s + whole.measures.tpot_p90_s) / 2)
    space = PlanConfig(hardware=("h200",), tp_sizes=(2,), max_num_seqs=(256,), max_num_batched_tokens=(8192,),
                       policies=("nano",), routers=("round_robin",), expert_parallel=(True, False))
    table = search(configurations(space, rc), PlanBase(rc, load_catalogue(("h200",)), slo, RouterConfig()), 4)
    passing = table[table["meets_slo"]]
    cheapest = passing[passing["cost_per_hour"] == passing["cost_per_hour"].min()]
    assert list(cheapest["expert_parallel"]) == [False] and list(cheapest["replicas"]) == [1]
