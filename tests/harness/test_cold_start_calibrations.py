"""The committed cold-start calibrations (profiles/<hardware>/<model>.cold_start.json): each reads
back, names the weight read it was measured with, and prices a new replica's start-up with the
phases its probe measured; the two H100 ones against the starts in their probes' own CSVs
(experiments/autoscale/h100_8b/, h100_0.6b/)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.autoscale.calibration import SUFFIX, find_calibration, read_calibration
from harness.autoscale.config import AutoscaleConfig
from harness.autoscale.run import cold_start_of
from harness.config import build_run_config
from harness.convert import ConfigError
from harness.profiles import PROFILES_DIR
from tests.harness.conftest import compose_config

AUTOSCALE = Path(__file__).resolve().parents[2] / "experiments" / "autoscale"
H100_8B = AUTOSCALE / "h100_8b"
READ_BY_FILE = {"h100/qwen3-8b": "mapped", "h200/qwen3-0.6b": "mapped", "h100/qwen3-0.6b": "streamed"}


@pytest.mark.parametrize("path", sorted(PROFILES_DIR.glob(f"*/*{SUFFIX}")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_committed_calibration_reads_back_and_names_its_weight_read(path):
    raw = json.loads(path.read_text())
    calibration = read_calibration(path)
    # the two older files were measured before the streamed read became the default onto a GPU
    assert raw["weight_read"] == calibration.weight_read == READ_BY_FILE[f"{path.parent.name}/{raw['model']}"]
    assert raw["hardware"] == path.parent.name and f"{raw['model']}{SUFFIX}" == path.name
    assert "python" in calibration.command and calibration.tp_size == 1


def test_qwen3_8b_on_an_h100_is_priced_by_its_measured_cold_start():
    rc = build_run_config(compose_config(["model=qwen3-8b"]))  # the H100, the default hardware
    calibration = find_calibration(rc.hardware.name, "qwen3-8b", 1)
    assert calibration is not None and calibration.path == PROFILES_DIR / "h100" / f"qwen3-8b{SUFFIX}"
    cold = cold_start_of(rc, AutoscaleConfig(provision_s=0.0), 1)
    # the probe's only start from disk (experiments/autoscale/h100_8b/log.txt: process 6.8, load 14.3 s,
    # KV 1.7, capture 3.9, ready 27.1 s), phase by phase: the set-up between the imports and the load
    # goes with the process, and the model's weight bytes differ from the files' by their headers
    disk = pd.read_csv(H100_8B / "cold_start" / "cold_start_qwen3-8b.csv").query("kind == 'disk'").iloc[0]
    assert cold.load_s == pytest.approx(disk["load_s"], abs=1e-3)
    assert cold.capture_s == pytest.approx(disk["capture_s"], abs=1e-6)
    assert cold.process_s == pytest.approx(disk["process_s"] + disk["setup_s"] + disk["kv_cache_s"] + disk["warm_up_s"],
                                           abs=1e-6)
    assert cold.total_s == pytest.approx(disk["startup_s"], abs=1e-3)
    assert round(cold.total_s, 1) == 27.1
    # a second replica on the machine reads the page cache: the probe's cached start, 7.1 s
    cached = calibration.cold_start(0.0, rc.model.weight_bytes_per_rank(1), eager=False, cached=True)
    page = pd.read_csv(H100_8B / "cold_start" / "cold_start_qwen3-8b.csv").query("kind == 'page cache'").iloc[0]
    assert cached.load_s == pytest.approx(page["load_s"], abs=1e-3)
    # the placeholders price it otherwise (60 s provisioning, 7 GB/s, 20 s capture): the file is what is read
    placeholder = cold_start_of(rc, AutoscaleConfig(provision_s=0.0, calibration=False), 1)
    assert abs(placeholder.total_s - cold.total_s) > 1.0


def test_a_calibration_with_an_unknown_weight_read_is_one_line(tmp_path):
    raw = json.loads((PROFILES_DIR / "h100" / f"qwen3-8b{SUFFIX}").read_text())
    path = tmp_path / f"qwen3-8b{SUFFIX}"
    path.write_text(json.dumps({**raw, "weight_read": "auto"}))
    with pytest.raises(ConfigError, match=r"weight_read must be one of \('mapped', 'streamed'\), got 'auto'$"):
        read_calibration(path)
    path.write_text(json.dumps({k: v for k, v in raw.items() if k != "weight_read"}))
    assert read_calibration(path).weight_read == "mapped"  # files from before the probe recorded it


def test_qwen3_0_6b_on_an_h100_is_priced_by_its_streamed_start():
    rc = build_run_config(compose_config(["model=qwen3-0.6b"]))
    calibration = find_calibration(rc.hardware.name, "qwen3-0.6b", 1)
    assert calibration is not None and calibration.path == PROFILES_DIR / "h100" / f"qwen3-0.6b{SUFFIX}"
    rows = pd.read_csv(AUTOSCALE / "h100_0.6b" / "cold_start_qwen3-0.6b.csv")
    disk = rows.query("kind == 'disk'").iloc[0]
    cold = cold_start_of(rc, AutoscaleConfig(provision_s=0.0), 1)
    assert cold.load_s == pytest.approx(disk["load_s"], abs=1e-3)
    assert cold.total_s == pytest.approx(disk["startup_s"], abs=1e-3)
    assert round(cold.total_s, 1) == 15.1  # experiments/autoscale/h100_0.6b/cold_start.log, start 2
    # the H200's file is another GPU's: an H100 replica is not priced by it
    h200 = read_calibration(PROFILES_DIR / "h200" / f"qwen3-0.6b{SUFFIX}")
    assert abs(h200.cold_start(0.0, rc.model.weight_bytes_per_rank(1), eager=False, cached=False).total_s
               - cold.total_s) > 0.1
