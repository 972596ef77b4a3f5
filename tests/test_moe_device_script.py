"""experiments/moe/device_run.sh: bad settings refused in one line before any work, and (slow) its
bench, bound and skew parts end to end on CPU with the tiny MoE model (CPU=1), the files the lead
reads afterwards all written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "experiments/moe/device_run.sh"


def _run(tmp_path: Path, timeout: int = 60, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, OUT=str(tmp_path / "out"), **env,
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", SCRIPT], cwd=ROOT, env=full, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("env, said", [({"PARTS": "tests,bnech"}, "unknown part 'bnech'"),
                                       ({"CPU": "yes"}, "CPU must be 0 or 1"),
                                       ({"TUNE_BUDGET_S": "2m"}, "TUNE_BUDGET_S must be whole seconds"),
                                       ({"TUNE": "always"}, "TUNE must be auto, missing or skip")])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, env, said):
    run = _run(tmp_path, **env)
    assert run.returncode == 2 and said in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_bound_and_skew_on_cpu(tmp_path):
    run = _run(tmp_path, timeout=900, CPU="1")
    out = tmp_path / "out"
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    bench = pd.read_csv(out / "bench" / "bench.csv")
    assert list(bench.variant) == ["default"] and bench.output_tok_s.iloc[0] > 0
    bound = json.loads((out / "bench" / "bound.json").read_text())
    assert bound["fraction_of_bound"] == pytest.approx(bench.output_tok_s.iloc[0] / bound["bound_output_tok_s"])
    assert (out / "bench" / "steps.csv.gz").is_file() and not (out / "skew" / "steps.csv").exists()
    skew = json.loads((out / "skew" / "skew.json").read_text())
    assert skew["layers"] == 2 and skew["top_k"] == 2 and 0.0 <= skew["skew"] <= 8.0
    summary = (out / "summary.txt").read_text()
    assert "bound:" in summary and "skew:" in summary and summary.rstrip().endswith("done")
