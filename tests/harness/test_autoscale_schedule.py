"""The schedule policy (a replica count set in advance) on the simulated fleet, the measured cold
start (profiles/<hardware>/<model>.cold_start.json) pricing a new replica's start-up, and an engine
fleet of two CPU replicas whose second starts mid-run (slow: two engine processes)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from harness.autoscale import calibration as calibration_module
from harness.autoscale.calibration import find_calibration
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.run import cold_start_of, lifetimes_frame, run_autoscaled
from harness.config import build_run_config
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig, build_fleet
from harness.study import run_study
from tests.harness.conftest import compose_config

STEP_UP = ["workload=poisson", "workload.rate_profile=[[0,2],[20,30]]", "workload.duration_s=60",
           "workload.prompt_len.high=300", "workload.output_len.high=100", "scheduler.max_num_seqs=8",
           "router=least_requests"]
MEASURED = {"hardware": "h100", "model": "qwen3-0.6b", "tp_size": 1, "process_s": 9.0, "load_bytes_per_s": 2.0e9,
            "cached_load_bytes_per_s": 8.0e9, "kv_cache_s": 3.0, "warm_up_s": 0.5, "capture_s": 6.0,
            "command": "python -m experiments.autoscale.cold_start --model qwen3-0.6b"}


def _step_up(schedule="[[0,1],[20,2]]", **extra):
    cfg = compose_config(STEP_UP)
    rc = build_run_config(cfg)
    _, router = build_fleet(cfg)
    config = AutoscaleConfig(policy="schedule", schedule=tuple(json.loads(schedule)), max_replicas=2, interval_s=5.0,
                             provision_s=0.0, **extra)
    return run_autoscaled(rc, FleetConfig(replicas=1), router, config, SLO(ttft_p90_s=1.0), progress=False)


def test_the_schedule_starts_a_replica_at_its_time_which_serves_once_started():
    outcome = _step_up(calibration=False, graph_capture_s=4.0)
    lifetimes = lifetimes_frame(outcome.elastic)
    assert [(e.time_s, e.direction, e.replicas) for e in outcome.elastic.events] == [(20.0, "up", (1,))]
    assert lifetimes["requested_s"].tolist() == [0.0, 20.0]
    assert lifetimes["ready_s"].iloc[1] == pytest.approx(20.0 + outcome.cold_start.total_s)
    requests = outcome.fleet.requests
    late = requests[requests["replica"] == 1]
    assert len(late) and (late["arrival"] >= lifetimes["ready_s"].iloc[1]).all()
    assert outcome.summary.to_row()["scale_ups"] == 1


def test_a_schedule_going_down_drains_a_replica():
    outcome = _step_up(schedule="[[0,2],[30,1]]", scale_down_cooldown_s=0.0, calibration=False, min_replicas=1)
    down = [e for e in outcome.elastic.events if e.direction == "down"]
    assert [(e.time_s, len(e.replicas)) for e in down] == [(30.0, 1)]


@pytest.fixture
def measured_profiles(tmp_path, monkeypatch):
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "qwen3-0.6b.cold_start.json").write_text(json.dumps(MEASURED))
    monkeypatch.setattr(calibration_module, "PROFILES_DIR", tmp_path)
    return tmp_path


def test_a_measured_cold_start_prices_the_start_up_where_there_is_one(measured_profiles):
    rc = build_run_config(compose_config([]))  # qwen3-0.6b on an H100
    weight = rc.model.weight_bytes_per_rank(1)
    cold = cold_start_of(rc, AutoscaleConfig(provision_s=60.0), 1)
    assert cold.provision_s == 60.0 and cold.capture_s == 6.0 and cold.process_s == 12.5
    assert cold.load_s == pytest.approx(weight / 2.0e9)
    placeholder = cold_start_of(rc, AutoscaleConfig(provision_s=60.0, calibration=False), 1)
    assert placeholder.capture_s == 20.0 and placeholder.process_s == 0.0
    assert placeholder.load_s == pytest.approx(weight / rc.hardware.weight_load_bytes_per_s)
    eager = build_run_config(compose_config(["execution.enforce_eager=true"]))
    assert cold_start_of(eager, AutoscaleConfig(), 1).capture_s == 0.0
    assert find_calibration(rc.hardware.name, "qwen3-0.6b", 2) is None  # measured at TP 1 only
    assert find_calibration(rc.hardware.name, "qwen3-8b", 1) is None
    cached = find_calibration(rc.hardware.name, "qwen3-0.6b", 1).cold_start(0.0, weight, False, cached=True)
    assert cached.load_s == pytest.approx(weight / 8.0e9)


def test_a_broken_calibration_file_is_one_line(measured_profiles, tmp_path):
    path = measured_profiles / "h100" / "qwen3-0.6b.cold_start.json"
    path.write_text(json.dumps({k: v for k, v in MEASURED.items() if k != "capture_s"}))
    with pytest.raises(ConfigError, match=r"cold_start.json: a cold-start calibration needs \['capture_s'\]$"):
        run_study(compose_config(["output.plots=false", *STEP_UP, "autoscale.policy=schedule",
                                  "autoscale.schedule=[[0,1],[20,2]]"]), tmp_path / "out")


@pytest.mark.slow
def test_an_engine_fleet_starts_its_second_replica_on_schedule_and_routes_to_it_once_ready(tiny_checkpoint, tmp_path):
    """Two CPU engine processes: the second is launched at 1 s, says ready after loading, and
    takes traffic only then; the run writes the simulated autoscaler's tables."""
    overrides = ["output.plots=false", "model=tiny-qwen3", "hardware=cpu", "backend=engine",
                 f"backend.model={tiny_checkpoint}", "backend.device=cpu", "scheduler.max_model_len=256",
                 "cache.block_size=16", "workload=poisson", "workload.rate_profile=[[0,4],[1,10]]",
                 "workload.duration_s=14", "workload.prompt_len.low=8", "workload.prompt_len.high=60",
                 "workload.output_len.low=4", "workload.output_len.high=16", "router=round_robin",
                 "autoscale.policy=schedule", "autoscale.schedule=[[0,1],[1,2]]", "autoscale.max_replicas=2",
                 "autoscale.interval_s=1", "autoscale.report_window_s=1"]
    run_study(compose_config(overrides), tmp_path)
    lifetimes = pd.read_csv(tmp_path / "lifetimes.csv")
    requests = pd.read_csv(tmp_path / "requests.csv")
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert lifetimes["requested_s"].iloc[1] == pytest.approx(1.0, abs=0.2)
    ready = lifetimes["ready_s"].iloc[1]
    assert ready > lifetimes["requested_s"].iloc[1] and math.isfinite(ready)
    assert summary["cold_start_s"] == pytest.approx(ready - lifetimes["requested_s"].iloc[1])
    late = requests[requests["replica"] == 1]
    assert len(late) and (late["arrival"] >= ready - 0.01).all()
    assert summary["scale_ups"] == 1 and summary["num_requests"] == len(requests)
    assert {"starting", "serving", "ttft_p90_s"} <= set(pd.read_csv(tmp_path / "timeline.csv").columns)


def test_an_engine_fleet_starts_a_process_for_every_replica_the_schedule_adds():
    from harness.autoscale.fleets import processes_needed

    def needed(schedule, initial=1):
        return processes_needed(initial, AutoscaleConfig(policy="schedule", schedule=schedule, max_replicas=4))

    assert needed(((0, 1), (30, 2))) == 2
    assert needed(((0, 2), (30, 1), (60, 2))) == 3  # the drained replica's GPU is not reused
    assert needed(((10, 4),), initial=2) == 4
