"""A missing or broken checkpoint: one line through the harness, the same message from LLM(...).

The harness side runs in process: a ConfigError is what `python -m harness` prints as its one
line (tests/harness/test_outputs.py checks that through the real entry point).
"""

from __future__ import annotations

import shutil

import pytest

from engine import LLM
from engine.loader import CheckpointError, CheckpointNotFoundError
from harness.convert import ConfigError
from harness.study import run_study
from tests.harness.conftest import compose_config


def _harness_error(tmp_path, model_dir) -> str:
    cfg = compose_config(["backend=engine", "model=tiny-qwen3", "hardware=cpu", "backend.device=cpu",
                          f"backend.model={model_dir}", "scheduler.max_model_len=2048", "output.plots=false"])
    with pytest.raises(ConfigError) as error:
        run_study(cfg, tmp_path / "run")
    return str(error.value)


def _llm_message(model_dir) -> str:
    with pytest.raises(CheckpointError) as error:
        LLM(str(model_dir), device="cpu")
    return str(error.value)


@pytest.fixture
def truncated(tmp_path, tiny_checkpoint):
    folder = tmp_path / "truncated"
    shutil.copytree(tiny_checkpoint, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def test_missing_folder(tmp_path):
    missing = tmp_path / "nonexistent"
    message = _llm_message(missing)
    assert str(missing) in message
    with pytest.raises(CheckpointNotFoundError):  # still a FileNotFoundError for callers that catch that
        LLM(str(missing))
    assert issubclass(CheckpointNotFoundError, FileNotFoundError) and issubclass(CheckpointError, ValueError)
    line = _harness_error(tmp_path, missing)
    assert "\n" not in line and line.endswith(message)


def test_truncated_safetensors(tmp_path, truncated):
    message = _llm_message(truncated)
    assert str(truncated / "model.safetensors") in message and "truncated or corrupt" in message
    line = _harness_error(tmp_path, truncated)
    assert "\n" not in line and line.endswith(message)


@pytest.mark.slow  # two replica processes import torch before they fail
def test_a_fleet_whose_replicas_cannot_load_stops_in_one_line_through_the_cli(tmp_path, truncated):
    import os
    import subprocess
    import sys

    from harness.config import REPO_ROOT

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MPLBACKEND": "Agg"}
    result = subprocess.run([sys.executable, "-m", "harness", "backend=engine", "model=tiny-qwen3", "hardware=cpu",
                             "backend.device=cpu", f"backend.model={truncated}", "scheduler.max_model_len=2048",
                             "fleet.replicas=2", "output.progress=false"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: engine replica 1 failed during 'load': ") and "truncated or corrupt" in last
    assert "Traceback" not in result.stderr


def test_the_default_checkpoint_is_written_again_when_cut_short(tmp_path, monkeypatch, truncated):
    # A checkpoint left truncated by an interrupted in-place write is rewritten, not served.
    import harness.checkpoints as checkpoints
    from engine.checkpoint import is_complete
    from engine.core.model_shapes import MODEL_SHAPES
    from sim.specs import ModelSpec

    monkeypatch.setattr(checkpoints, "CHECKPOINT_ROOT", tmp_path)
    spec = ModelSpec.from_shape(MODEL_SHAPES["tiny-qwen3"])
    folder = tmp_path / "tiny-qwen3"
    shutil.copytree(truncated, folder)
    assert not is_complete(folder)
    checkpoints.ensure_checkpoint(str(folder), spec)
    assert is_complete(folder)
    weights = (folder / "model.safetensors").stat().st_mtime_ns
    checkpoints.ensure_checkpoint(str(folder), spec)  # complete: left alone
    assert (folder / "model.safetensors").stat().st_mtime_ns == weights
    shutil.rmtree(folder)
    checkpoints.ensure_checkpoint(str(folder), spec)  # missing: written
    assert is_complete(folder) and sorted(p.name for p in tmp_path.iterdir()) == ["tiny-qwen3", "truncated"]
