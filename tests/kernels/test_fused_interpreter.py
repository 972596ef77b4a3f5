"""Runs tests/kernels/interpret_fused.py under Triton's CPU interpreter (TRITON_INTERPRET=1) in a
subprocess: the fused kernels, their wiring into the model and the sampler's kernel path, checked
without a GPU. Slow (about a minute on two cores): -m slow."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_fused_kernels_under_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/kernels/interpret_fused.py", "-q", "-p", "no:cacheprovider",
         "-m", "", "-x"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
