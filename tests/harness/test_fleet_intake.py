"""backend.fleet_intake through the harness: the committed H200 calibration reads back and is
rebuilt by its command from the committed inputs; a fleet priced with it starts every request
later (an idle prefill replica's by the measured base at least, a stepping replica's by the base
less its poll lag); off, nothing changes;
a GPU host never measured is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.disagg import fleet_intake as calibrate
from harness.config import build_run_config
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig, build_fleet
from harness.fleet.disagg import run_disagg_once
from harness.fleet.disagg_config import build_disagg
from harness.fleet.intake import fleet_intake, intake_path, read_intake
from harness.fleet.run import run_fleet_once
from harness.study import run_study
from tests.harness.conftest import compose_config

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "experiments/disagg/h200x2_prefill_probe"
SMALL = ["hardware=h200", "workload=poisson", "workload.num_requests=40", "workload.rate=20",
         "workload.prompt_len.high=400", "workload.output_len.high=200", "output.plots=false"]


def test_the_committed_h200_intake_reads_back_and_its_command_rebuilds_it(tmp_path):
    path = intake_path("h200")
    intake = read_intake(path)
    assert 2e-4 < intake.base_s < 1e-3 and 0 < intake.per_token_s < 1e-6
    out = tmp_path / "intake.json"
    assert calibrate.main(["--polls", str(PROBE / "intake_polls.csv.gz"), "--probe", str(PROBE / "probe_steps.csv.gz"),
                           "--out", str(out)]) == 0
    rebuilt, committed = json.loads(out.read_text()), json.loads(path.read_text())
    assert (rebuilt["base_s"], rebuilt["per_token_s"]) == (committed["base_s"], committed["per_token_s"])
    assert "experiments.disagg.fleet_intake" in committed["command"]


def test_off_prices_nothing_and_an_unmeasured_host_is_one_line():
    assert fleet_intake(build_run_config(compose_config(SMALL))) is None
    rc = build_run_config(compose_config([*SMALL, "hardware=a100", "backend.fleet_intake=true"]))
    with pytest.raises(ConfigError, match=r"backend.fleet_intake=true: no measured fleet intake for hardware") as error:
        fleet_intake(rc)
    assert "\n" not in str(error.value)


def test_a_bad_calibration_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "fleet_intake.json"
    path.write_text(json.dumps({"base_s": -1, "per_token_s": 0, "poll_lag_s": 0, "command": "x"}))
    with pytest.raises(ConfigError, match="fleet_intake.json: Intake.base_s"):
        read_intake(path)
    path.write_text("{}")
    with pytest.raises(ConfigError, match="needs"):
        read_intake(path)


def _ttft_and_queue(outcome):
    requests = outcome.requests
    return requests["ttft"].to_numpy(), (requests["first_scheduled"] - requests["arrival"]).to_numpy()


def test_an_aggregated_fleet_starts_each_request_at_least_the_base_less_the_poll_lag_later():
    intake = read_intake(intake_path("h200"))
    rows = []
    for switch in ("false", "true"):
        config = compose_config([*SMALL, f"backend.fleet_intake={switch}"])
        rows.append(_ttft_and_queue(run_fleet_once(build_run_config(config), FleetConfig(replicas=2),
                                                   build_fleet(config)[1], False)))
    (_, before), (_, after) = rows
    assert (after >= intake.base_s - intake.poll_lag_s - 1e-9).all()
    assert after.mean() > before.mean() + 0.5 * (intake.base_s - intake.poll_lag_s)


def test_a_disaggregated_fleet_starts_each_prefill_later_and_its_ttft_with_it():
    intake = read_intake(intake_path("h200"))
    rows = []
    for switch in ("false", "true"):
        config = compose_config(["fleet=disaggregated", *SMALL, f"backend.fleet_intake={switch}"])
        rows.append(_ttft_and_queue(run_disagg_once(build_run_config(config), build_disagg(config),
                                                    build_fleet(config, with_fleet=False)[1], False)))
    (ttft_before, before), (ttft_after, after) = rows
    assert (after >= intake.base_s - intake.poll_lag_s - 1e-9).all()
    assert ttft_after.mean() > ttft_before.mean() + 0.5 * intake.base_s  # its prefill replicas mostly idle


def test_the_switch_on_a_run_through_the_harness(tmp_path):
    run_study(compose_config([*SMALL, "fleet.replicas=2", "backend.fleet_intake=true"]), tmp_path)
    assert (tmp_path / "summary.csv").is_file()
