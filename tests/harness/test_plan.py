"""The deployment search: the fewest replicas by growth and bisection, the cheapest deployment
under the dominance rule, bad input in one line, the SLO no deployment meets, and a plan on a
user's trace (its own workload, named after the file, its fit to max_model_len reported once)."""

from __future__ import annotations

import dataclasses
import logging
import math
import re

import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.plan.config import SLOConfig, load_catalogue
from harness.plan.evaluate import PlanBase
from harness.plan.row import Deployment, PlanRow
from harness.plan.search import ReplicaSearch, search
from harness.study import run_study
from tests.harness.conftest import compose_config

PLAN_SMALL = ["experiment=plan", "model=qwen3-0.6b", "workload.num_requests=60", "workload.rate=60",
              "workload.prompt_len.high=300", "workload.output_len.high=100", "plan.hardware=[a100,h100]",
              "plan.tp_sizes=[1]", "plan.max_num_seqs=[64]", "plan.max_num_batched_tokens=[4096]",
              "plan.policies=[nano]", "plan.routers=[round_robin,least_requests]", "plan.max_replicas=8"]


def _row(d: Deployment, ok: bool, ratio: float) -> PlanRow:
    return PlanRow(d, cost_per_hour=0.0, slo_ratio=ratio, meets_slo=ok, error="", eval_s=0.0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 64))
def test_growth_then_bisection_finds_the_fewest_replicas(needed):
    s = ReplicaSearch(Deployment("h100", 1, 64, 4096, "nano", "round_robin"), max_replicas=64)
    probes = []
    while (replicas := s.next_replicas(cap=64)) is not None:
        probes.append(replicas)
        s.record(replicas, _row(s.config, replicas >= needed, needed / replicas))
    assert s.passing == needed
    assert len(probes) <= 2 * math.ceil(math.log2(needed)) + 1
    assert len(set(probes)) == len(probes)


def test_growth_stops_on_a_latency_floor():
    s = ReplicaSearch(Deployment("h100", 1, 64, 4096, "nano", "round_robin"), max_replicas=64)
    probes = []
    while (replicas := s.next_replicas(cap=64)) is not None:
        probes.append(replicas)
        s.record(replicas, _row(s.config, False, 3.0 + 1.0 / replicas))  # never below 3x the SLO
    assert s.passing is None and probes[-1] < 64


@settings(max_examples=30, deadline=None)
# the cheapest (13 x a100) lies below a bisection midpoint (14) that the best found so far caps
@example(needed_on={"h100": 6, "a100": 13, "h200": 5}, tp_sizes=[1])
@given(st.dictionaries(st.sampled_from(["a100", "h100", "h200"]), st.integers(1, 20), min_size=3, max_size=3),
       st.lists(st.sampled_from([1, 2]), min_size=1, max_size=2, unique=True))
def test_search_returns_the_brute_force_cheapest(needed_on, tp_sizes):
    """A synthetic fleet: a deployment meets the SLO with needed_on[hw] / tp replicas or more."""
    catalogue = load_catalogue(("a100", "h100", "h200"))
    base = PlanBase(rc=None, catalogue=catalogue, slo=SLOConfig(), router=None)
    configs = [Deployment(hw, tp, 64, 4096, "nano", "round_robin") for hw in catalogue for tp in tp_sizes]

    def need(d):
        return math.ceil(needed_on[d.hardware] / d.tp_size)

    def synthetic(fn, deployments):
        return [dataclasses.replace(_row(d, d.replicas >= need(d), need(d) / d.replicas),
                                    cost_per_hour=base.cost_per_hour(d)) for d in deployments]

    table = search(configs, base, max_replicas=64, mapper=synthetic)
    brute = min(base.cost_per_hour(Deployment(**{**c.__dict__, "replicas": need(c)})) for c in configs)
    assert table[table["meets_slo"]]["cost_per_hour"].min() == pytest.approx(brute)


def test_plan_writes_every_deployment_and_the_fewest_replicas(tmp_path, capsys):
    table = run_study(compose_config(PLAN_SMALL + ["slo.ttft_p90_s=0.5", "slo.tpot_p90_s=0.05"]), tmp_path)
    saved = pd.read_csv(tmp_path / "plan.csv")
    assert len(saved) == len(table) and (tmp_path / "plan.png").stat().st_size > 0
    for column in ("cost_per_hour", "gpus", "replicas", "tp_size", "hardware", "policy", "router", "max_num_seqs",
                   "max_num_batched_tokens", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p90_s", "e2e_p99_s",
                   "output_tok_s", "meets_slo"):
        assert column in saved
    cheapest = saved[saved["meets_slo"]].sort_values("cost_per_hour").iloc[0]
    assert cheapest["ttft_p90_s"] <= 0.5 and cheapest["tpot_p90_s"] <= 0.05
    same = saved[(saved["hardware"] == cheapest["hardware"]) & (saved["router"] == cheapest["router"])]
    if cheapest["replicas"] > 1:  # one replica fewer was tried and missed the SLO
        assert not same[same["replicas"] == cheapest["replicas"] - 1]["meets_slo"].any()
    assert "cheapest deployment meeting the SLO" in capsys.readouterr().out


def test_an_slo_no_deployment_meets_names_the_nearest_and_what_to_relax(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^slo: no deployment in the search space meets P90 TTFT <= 1e-05 s") as err:
        run_study(compose_config(PLAN_SMALL + ["slo.ttft_p90_s=1e-5", "plan.num_closest=2"]), tmp_path)
    assert "\n" not in str(err.value)
    out = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(out) if line.startswith("no deployment meets"))
    assert len(out) - start == 1 + 2 + 1  # the heading, the 2 nearest, what to relax
    table = pd.read_csv(tmp_path / "plan.csv")
    summary = pd.read_csv(tmp_path / "plan_summary.csv").iloc[0]
    assert len(table) >= 2 and not summary["meets_slo"] and summary["deployments_evaluated"] == len(table)
    nearest = table.sort_values(["slo_ratio", "cost_per_hour"]).iloc[0]
    assert summary["ttft_p90_s"] == pytest.approx(nearest["ttft_p90_s"])
    # the relaxed target it suggests is met by the nearest deployment, and not far above it
    relaxed = float(re.search(r"slo\.ttft_p90_s=([0-9.e-]+) would admit the nearest", out[-1]).group(1))
    assert nearest["ttft_p90_s"] <= relaxed <= 1.1 * nearest["ttft_p90_s"]
    assert f"slo.ttft_p90_s={relaxed:g}" in str(err.value)


def test_a_catalogue_entry_without_a_price_names_the_field(tmp_path, monkeypatch):
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware" / "gpu_x.yaml").write_text(
        "name: X\npeak_flops: 1.0e+12\nmem_bandwidth: 1.0e+12\nmem_bytes: 1000000000\ninterconnect_bandwidth: 1.0e+9\n")
    monkeypatch.setattr("harness.config.CONF_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"^hardware/gpu_x.price_per_gpu_hour is missing"):
        load_catalogue(("gpu_x",))


@pytest.mark.parametrize("override, message", [
    ("plan.tp_sizes=[3]", r"plan.tp_sizes\[0\]: TP size 3 does not divide model.num_heads"),
    ("plan.routers=[random]", r"plan.routers\[0\] must be one of"),
    ("plan.hardware=[tpu]", r"plan.hardware\[0\]: no entry conf/hardware/tpu.yaml"),
    ("slo.ttft_p90_s=0", r"slo.ttft_p90_s must be a finite number > 0"),
])
def test_bad_plan_input_is_one_line_naming_the_field(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(PLAN_SMALL + [override]), tmp_path)
    assert "\n" not in str(error.value)


def test_the_plans_own_workload_gives_way_to_any_other():
    rc = build_run_config(compose_config(["experiment=plan"]))
    assert (rc.workload.arrival, rc.workload.rate, rc.workload.num_requests, rc.workload.label) == \
        ("poisson", 40.0, 400, "poisson")
    trace = build_run_config(compose_config(["experiment=plan", "workload=trace_azure_conv",
                                             "workload.num_requests=2000"])).workload
    assert (trace.arrival, trace.rate, trace.num_requests, trace.label) == ("trace", None, 2000, "azure_conv_2023")
    assert build_run_config(compose_config(["experiment=plan", "workload.rate=20"])).workload.rate == 20.0


def test_a_plan_on_a_trace_is_named_after_it_and_reports_its_fit_once(tmp_path, caplog, capsys):
    """A user's trace with requests over max_model_len: every deployment plans the clipped requests;
    the warning (with both ways out) comes once, and plan_summary.csv counts them."""
    lines = [f"{0.02 * i},{3000 if i % 4 == 0 else 200},{50}" for i in range(40)]
    path = tmp_path / "my_trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(lines) + "\n")
    overrides = [o for o in PLAN_SMALL if not o.startswith("workload.")]
    overrides += ["workload=trace", f"workload.trace_path={path}", "scheduler.max_model_len=2048",
                  "plan.hardware=[a100,h100,h200]"]
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError, match="^slo: no deployment"):
        run_study(compose_config(overrides + ["slo.ttft_p90_s=1e-5"]), tmp_path / "none")  # every deployment tried
    fit = [r.getMessage() for r in caplog.records if "longer than max_model_len" in r.getMessage()]
    assert fit == ["workload my_trace: 10 of 40 requests are longer than max_model_len=2048 and planned clipped "
                   "(10,020 prompt and 0 output tokens cut); to plan for them whole, set scheduler.max_model_len=3050 "
                   "(the longest request), or workload.oversize=skip to leave them out"]
    assert len(pd.read_csv(tmp_path / "none" / "plan.csv")) > 3
    summary = pd.read_csv(tmp_path / "none" / "plan_summary.csv").iloc[0]
    assert (summary["workload"], summary["num_requests"], summary["num_clipped"], summary["num_skipped"]) == \
        ("my_trace", 40, 10, 0)
    assert summary["longest_request_tokens"] == 3050 and not summary["meets_slo"]
    assert "deployments evaluated (my_trace)" in capsys.readouterr().out

    run_study(compose_config(overrides + ["workload.oversize=skip"]), tmp_path / "met")
    summary = pd.read_csv(tmp_path / "met" / "plan_summary.csv").iloc[0]
    assert (summary["num_requests"], summary["num_clipped"], summary["num_skipped"]) == (30, 0, 10)
    assert summary["meets_slo"] and "(with 10 requests over max_model_len" in capsys.readouterr().out


def test_a_plan_with_every_request_left_out_is_refused_before_searching(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,3000,5\n1,4000,5\n")
    overrides = [o for o in PLAN_SMALL if not o.startswith("workload.")]
    overrides += ["workload=trace", f"workload.trace_path={path}", "scheduler.max_model_len=2048",
                  "workload.oversize=skip"]
    with pytest.raises(ConfigError, match=r"^nothing to plan for: all 2 requests of workload long are longer than "
                                          r"max_model_len=2048.*scheduler.max_model_len=4005"):
        run_study(compose_config(overrides), tmp_path / "out")
    assert not (tmp_path / "out" / "plan.csv").exists()


@pytest.mark.parametrize("override, message", [
    ("scheduler.max_num_seqs=32", r"^scheduler.max_num_seqs=32 is ignored by experiment=plan, which searches "
                                  r"plan.max_num_seqs"),
    ("scheduler.max_num_batched_tokens=2048", r"^scheduler.max_num_batched_tokens=2048 is ignored by .*"
                                              r"plan.max_num_batched_tokens"),
    ("scheduler=mixed", r"^scheduler.policy='mixed' is ignored by .*plan.policies"),
    ("execution.tensor_parallel_size=2", r"^execution.tensor_parallel_size=2 is ignored by .*plan.tp_sizes"),
    ("router=least_tokens", r"^router.name='least_tokens' is ignored by .*plan.routers"),
    ("fleet.replicas=4", r"^fleet.replicas=4 is ignored by .*plan.max_replicas"),
    ("fleet.tp_size=2", r"^fleet.tp_size=2 is ignored by .*plan.tp_sizes"),
    ("autoscale.policy=utilisation", r"^autoscale.policy='utilisation' is ignored by experiment=plan"),
    ("fleet=disaggregated", r"^fleet=disaggregated is ignored by experiment=plan.*plan.modes=\[disaggregated\]"),
])
def test_a_setting_the_plan_searches_itself_is_refused_not_ignored(override, message, tmp_path):
    """The plan replaces these by its own lists; set on the command line they would leave plan.csv
    answering another question than the one asked, so they stop the plan before it searches."""
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(PLAN_SMALL + [override]), tmp_path)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "plan.csv").exists()


def test_a_plan_tp_size_over_one_nodes_gpus_runs_nowhere(tmp_path):
    """No catalogue GPU has 16 in a node: every deployment is an error row, and the plan says why."""
    with pytest.raises(ConfigError, match=r"none could run \(.*TP size 16 exceeds the 8 GPUs of one") as error:
        run_study(compose_config(PLAN_SMALL + ["plan.tp_sizes=[16]"]), tmp_path)
    assert "\n" not in str(error.value)
    table = pd.read_csv(tmp_path / "plan.csv")
    assert len(table) and (~table["meets_slo"]).all() and table["error"].str.contains("exceeds the 8 GPUs").all()


@pytest.mark.parametrize("modes", ["[aggregated]", "[disaggregated]"])
def test_a_plan_where_no_deployment_runs_says_why_in_one_line(modes, tmp_path):
    """Qwen3-32B's weights alone overflow half of an 80 GB GPU: every deployment is an error row,
    plan.csv keeps the metric columns (empty) and the plan ends with the reason, not a traceback."""
    overrides = [o for o in PLAN_SMALL if not o.startswith("model=")]
    overrides += ["model=qwen3-32b", "execution.gpu_memory_utilization=0.5", f"plan.modes={modes}",
                  "plan.disagg_max_pool_replicas=1"]
    with pytest.raises(ConfigError, match=r"none could run \(.*qwen3-32b does not fit on") as error:
        run_study(compose_config(overrides), tmp_path)
    assert "\n" not in str(error.value)
    table = pd.read_csv(tmp_path / "plan.csv")
    assert len(table) and (table["error"] != "").all() and table["ttft_p90_s"].isna().all()
    assert (tmp_path / "plan.png").is_file()


def test_an_hourly_cost_is_a_price_times_gpus_to_a_millionth_of_a_dollar():
    from harness.plan.row import hourly_cost

    assert 1.3 * 3 != 3.9  # the binary fraction plan.csv printed as 3.9000000000000004
    assert hourly_cost((1.3, 3)) == 3.9
    assert hourly_cost((1.3, 2), (2.6, 1)) == hourly_cost((2.6, 2)) == 5.2  # two pools tie with one
    assert hourly_cost((0.1234567, 1)) == 0.123457
