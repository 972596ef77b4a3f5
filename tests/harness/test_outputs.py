"""What a run leaves on disk: a gzipped step table (or none), plain CSVs, no empty folder on a
config failure, and a non-zero exit when nothing was served."""

from __future__ import annotations

import gzip
import logging
import os
import subprocess
import sys

import pandas as pd
import pytest

from harness.config import REPO_ROOT
from harness.convert import ConfigError
from harness.output.metrics import LEGACY_STEPS_FILE, STEPS_FILE, read_steps
from harness.study import build_study, run_study
from tests.harness.conftest import compose_config

QUICK = ["workload.num_requests=12", "output.plots=false"]


def _entry_point(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    """`python -m harness` as a user runs it, from tmp_path (so outputs/ lands there)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "harness", "output.progress=false", *overrides], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)


def test_steps_are_gzipped_and_the_other_tables_plain(tmp_path):
    table = run_study(compose_config(QUICK), tmp_path)
    with gzip.open(tmp_path / STEPS_FILE, "rt") as f:  # a real gzip stream, not a renamed CSV
        assert f.readline().startswith("step,start,duration,kind")
    steps = pd.read_csv(tmp_path / STEPS_FILE)  # pandas reads it as it is
    assert len(steps) == table.iloc[0]["num_steps"] and steps["step"].is_monotonic_increasing
    assert not (tmp_path / LEGACY_STEPS_FILE).exists()
    for name in ("requests.csv", "summary.csv"):
        assert (tmp_path / name).read_bytes()[:2] != b"\x1f\x8b", name  # no gzip magic
    pd.testing.assert_frame_equal(read_steps(tmp_path), steps)


def test_output_steps_none_writes_no_step_table(tmp_path):
    run_study(compose_config(QUICK + ["output.steps=none"]), tmp_path)
    assert (tmp_path / "summary.csv").is_file() and (tmp_path / "requests.csv").is_file()
    assert not list(tmp_path.glob("steps.csv*"))
    with pytest.raises(FileNotFoundError, match="output.steps=none"):
        read_steps(tmp_path)


def test_sweep_points_follow_output_steps(tmp_path):
    sweep = ["study.kind=sweep", "study.param=scheduler.policy", "study.values=[nano,mixed]"]
    run_study(compose_config(QUICK + sweep + ["output.steps=none"]), tmp_path)
    points = sorted((tmp_path / "points").iterdir())
    assert len(points) == 2 and all((p / "summary.csv").is_file() for p in points)
    assert not list((tmp_path / "points").rglob("steps.csv*"))


def test_bad_output_steps_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"output\.steps must be one of \('full', 'none'\), got 'some'"):
        build_study(compose_config(["output.steps=some"]))


def test_read_steps_still_reads_an_old_plain_table(tmp_path):
    old = pd.DataFrame({"step": [0, 1], "start": [0.0, 0.5], "duration": [0.5, 0.25]})
    old.to_csv(tmp_path / LEGACY_STEPS_FILE, index=False)
    pd.testing.assert_frame_equal(read_steps(tmp_path), old)


def test_config_failure_leaves_no_run_folder(tmp_path):
    result = _entry_point(tmp_path, "workload.trace_path=x.csv")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("error: workload.trace_path")
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))


def test_run_that_serves_nothing_exits_non_zero_with_one_line(tmp_path):
    result = _entry_point(tmp_path, "cache.num_blocks=1", "workload.num_requests=5", "output.plots=false")
    assert result.returncode == 2
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "nothing was served: all 5 requests were rejected at admission" in error[0]
    # the folder stays: it says which requests were refused and why
    rejected = list((tmp_path / "outputs").rglob("rejected.csv"))
    assert len(rejected) == 1 and len(pd.read_csv(rejected[0])) == 5


def test_nothing_served_is_a_config_error_in_process(tmp_path):
    with pytest.raises(ConfigError, match="nothing was served: all 4 requests were rejected"):
        run_study(compose_config(["workload.num_requests=4", "cache.num_blocks=1", "output.plots=false"]), tmp_path)


def test_a_sweep_point_that_serves_nothing_is_named(tmp_path):
    cfg = compose_config(QUICK + ["study.kind=sweep", "study.param=cache.num_blocks", "study.values=[400,1]"])
    with pytest.raises(ConfigError, match=r"sweep point cache.num_blocks=1: nothing was served"):
        run_study(cfg, tmp_path)


def test_partial_rejection_is_logged_and_counted(tmp_path, caplog):
    # 2 blocks of 256 tokens hold short requests only: some are refused, the rest served
    with caplog.at_level(logging.WARNING, logger="harness.run"):
        table = run_study(compose_config(["workload.num_requests=30", "cache.num_blocks=2", "output.plots=false"]),
                          tmp_path)
    rejected = int(table.iloc[0]["num_rejected"])
    assert 0 < rejected < 30
    assert f"{rejected} of 30 requests were rejected at admission" in caplog.text
    assert pd.read_csv(tmp_path / "summary.csv").iloc[0]["num_rejected"] == rejected
