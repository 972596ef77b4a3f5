"""Fleet runs through the harness: a fleet of one writes today's tables, bad fleet input fails in one line."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig, build_fleet
from harness.fleet.run import run_fleet_once
from harness.output.metrics import read_steps
from harness.run import run_once
from harness.study import run_study
from tests.harness.conftest import compose_config

SMALL = ["workload=poisson", "workload.num_requests=60", "workload.rate=30", "workload.prompt_len.high=400",
         "workload.output_len.high=200"]
VOLATILE = ["wall_s", "router", "replicas", "tp_sizes", "gpus", "replica", "num_rejected"]


def test_a_fleet_of_one_writes_the_single_runs_tables():
    rc = build_run_config(compose_config(SMALL))
    single = run_once(rc, progress=False)
    fleet = run_fleet_once(rc, FleetConfig(replicas=1, tp_size=1), build_fleet(compose_config(SMALL))[1], False)
    pd.testing.assert_frame_equal(fleet.requests.drop(columns="replica"), single.requests)
    pd.testing.assert_frame_equal(fleet.steps.drop(columns="replica"), single.steps)
    expected = {k: v for k, v in single.summary.items() if k not in VOLATILE}
    assert {k: v for k, v in fleet.summary.items() if k in expected} == expected


def test_fleet_replicas_one_is_todays_run_and_two_splits_the_requests(tmp_path):
    run_study(compose_config(SMALL + ["output.plots=false"]), tmp_path / "plain")
    run_study(compose_config(SMALL + ["output.plots=false", "fleet.replicas=1"]), tmp_path / "one")
    assert (tmp_path / "plain" / "requests.csv").read_text() == (tmp_path / "one" / "requests.csv").read_text()
    pd.testing.assert_frame_equal(read_steps(tmp_path / "plain"), read_steps(tmp_path / "one"))
    run_study(compose_config(SMALL + ["fleet.replicas=2", "router=least_requests"]), tmp_path / "two")
    requests = pd.read_csv(tmp_path / "two" / "requests.csv")
    assert sorted(requests["request_id"]) == sorted(pd.read_csv(tmp_path / "plain" / "requests.csv")["request_id"])
    assert set(requests["replica"]) == {0, 1}
    for index in (0, 1):
        part = pd.read_csv(tmp_path / "two" / f"replica_{index}" / "requests.csv")
        assert len(part) == (requests["replica"] == index).sum()
    summary = pd.read_csv(tmp_path / "two" / "summary.csv").iloc[0]
    assert summary["num_requests"] == 60 and summary["replicas"] == 2 and summary["gpus"] == 2
    assert (tmp_path / "two" / "load.png").stat().st_size > 0 and (tmp_path / "two" / "latency_cdf.png").exists()


def test_two_replicas_serve_a_rate_sooner_than_one():
    rc = build_run_config(compose_config(SMALL + ["workload.rate=400"]))
    _, router = build_fleet(compose_config(SMALL))
    one = run_fleet_once(rc, FleetConfig(replicas=1, tp_size=1), router, False).summary
    two = run_fleet_once(rc, FleetConfig(replicas=2), router, False).summary
    assert two["e2e_p90_s"] < one["e2e_p90_s"]


@pytest.mark.parametrize("override, message", [
    ("fleet.replicas=0", r"fleet.replicas must be an int >= 1, got 0"),
    ("fleet.replicas=-2", r"fleet.replicas must be an int >= 1"),
    ("fleet.tp_size=3", r"fleet.tp_size: TP size 3 does not divide model.num_heads=16"),
    ("fleet.tp_sizes=[1,3]", r"fleet.tp_sizes\[1\].*model.num_heads"),
    ("fleet.tp_sizes=[1]", r"fleet.tp_sizes must list one TP size per replica \(2\)"),
    ("router.name=random", r"router.name must be one of \['round_robin'"),
    ("cache.num_blocks=1", r"nothing was served: all 256 requests were rejected at admission"),
    # a TP group stays in one node, as a disaggregated pool's does: 16 ranks would be priced on NVLink
    ("fleet.tp_size=16", r"fleet.tp_size: TP size 16 exceeds the 8 GPUs of one H100-SXM5-80GB node \(hardware.gpus_"),
    ("fleet.tp_sizes=[1,16]", r"fleet.tp_sizes\[1\]: TP size 16 exceeds the 8 GPUs of one H100-SXM5-80GB node"),
])
def test_bad_fleet_input_is_one_line_naming_the_field(override, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(["fleet.replicas=2", override] if "replicas" not in override else [override]),
                  tmp_path)
    assert "\n" not in str(error.value)



@pytest.mark.parametrize("overrides, message", [
    # one replica routes nothing: not even the router's name is read
    (["router=prefix_affinity"], r"^router.name='prefix_affinity' is ignored by a single replica \(fleet.replicas=1\)"),
    (["router.max_imbalance=4"], r"^router.max_imbalance=4 is ignored by a single replica"),
    (["fleet.replicas=2", "router.prefix_blocks=4"],
     r"^router.prefix_blocks=4 is ignored by router.name=round_robin; it is read only with "
     r"router.name=prefix_affinity"),
    (["fleet=disaggregated", "router.max_imbalance=3"], r"^router.max_imbalance=3 is ignored by fleet=disaggregated"),
    (["fleet=disaggregated", "fleet.prefill_router=round_robin", "fleet.decode_router=least_requests",
      "router=least_tokens"],
     r"^router.name='least_tokens' is ignored by fleet=disaggregated .*a pool without a router"),
    (["experiment=plan", "router.prefix_blocks=2"],
     r"^router.prefix_blocks=2 is ignored by experiment=plan's plan.routers=\['round_robin', 'least_requests'\]"),
])
def test_a_router_setting_no_router_in_use_reads_is_refused(overrides, message, tmp_path):
    with pytest.raises(ConfigError, match=message) as error:
        run_study(compose_config(["workload.num_requests=10", *overrides]), tmp_path)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overrides", [
    ["fleet.replicas=2", "router=prefix_affinity", "router.prefix_blocks=2", "router.max_imbalance=4"],
    ["fleet=disaggregated", "fleet.decode_router=prefix_affinity", "router.max_imbalance=3"],
])
def test_router_settings_a_router_in_use_reads_are_served(overrides, tmp_path):
    run_study(compose_config(["workload.num_requests=10", *overrides]), tmp_path)
    assert pd.read_csv(tmp_path / "summary.csv").iloc[0]["num_requests"] == 10


def test_a_single_simulated_run_keeps_its_tp_group_in_one_node(tmp_path):
    with pytest.raises(ConfigError, match=r"^execution.tensor_parallel_size: TP size 16 exceeds the 8 GPUs of one "
                                          r"H100-SXM5-80GB node"):
        run_study(compose_config(["workload.num_requests=10", "execution.tensor_parallel_size=16"]), tmp_path)
