"""One spelling per model: the `model=` option, the simulator's spec name and the engine's default
checkpoint folder are the same string; other spellings stop with one line naming it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from engine.core.model_shapes import MODEL_SHAPES, RENAMED
from harness.checkpoints import CHECKPOINT_ROOT
from harness.config import CONF_DIR, REPO_ROOT, build_run_config
from harness.convert import ConfigError
from harness.study import StudyConfig
from harness.sweeps.sweep import point_configs
from sim.specs import ModelSpec
from tests.harness.conftest import compose_config

OPTIONS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))


def test_every_named_model_is_an_option():
    assert set(MODEL_SHAPES) <= set(OPTIONS)


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_option_composes_into_its_models_spec_and_checkpoint_folder(name):
    rc = build_run_config(compose_config([f"model={name}"]))
    assert rc.model == ModelSpec.from_shape(MODEL_SHAPES[name])
    assert rc.model.name == name
    engine_rc = build_run_config(compose_config(["backend=engine", f"model={name}"]))
    assert engine_rc.engine.model == str(CHECKPOINT_ROOT / name)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_other_spelling_is_one_config_error_naming_the_model(old, new):
    assert old in OPTIONS  # composes, so the error below is ours and not Hydra's option list
    with pytest.raises(ConfigError, match=rf"^model\.preset: model '{old}' is spelled '{new}' \(model={new}, "):
        build_run_config(compose_config([f"model={old}"]))


def test_other_spelling_on_the_command_line_prints_one_line(tmp_path):
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "harness", "model=qwen3_8b"], cwd=tmp_path,
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "model=qwen3-8b" in lines[0] and "Traceback" not in result.stderr


def test_fields_override_the_preset_and_only_those():
    rc = build_run_config(compose_config(["model=qwen3-8b", "+model.num_layers=4", "+model.dtype=float8_e4m3fn"]))
    preset = ModelSpec.from_shape(MODEL_SHAPES["qwen3-8b"])
    assert rc.model == dataclasses.replace(preset, num_layers=4, dtype="float8_e4m3fn")
    assert rc.model.dtype_bytes == 1 and rc.model.weight_bytes == rc.model.num_params


def test_overridden_shape_needs_its_own_checkpoint_folder(tmp_path):
    # The preset's random-weight checkpoint would not have the overridden shape.
    with pytest.raises(ConfigError, match=r"backend\.model: .*overridden model field\(s\) \['num_layers'\]"):
        build_run_config(compose_config(["backend=engine", "model=tiny-qwen3", "+model.num_layers=3"]))
    rc = build_run_config(compose_config(["backend=engine", "model=tiny-qwen3", "+model.num_layers=3",
                                          f"backend.model={tmp_path}"]))
    assert rc.engine.model == str(tmp_path) and rc.model.num_layers == 3


def test_a_model_without_preset_lists_every_field():
    fields = {"name": "mine", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
              "intermediate_size": 128, "vocab_size": 512}
    overrides = ["model.preset=null"] + [f"+model.{k}={v}" for k, v in fields.items()]
    assert build_run_config(compose_config(overrides)).model == ModelSpec(**fields)
    with pytest.raises(ConfigError, match=r"model: missing required field\(s\) \['head_dim'"):
        build_run_config(compose_config([o for o in overrides if "head_dim" not in o]))


def test_sweep_over_the_model_group_uses_the_spelling():
    cfg = compose_config([])
    study = StudyConfig(kind="sweep", param="model", values=("tiny-qwen3", "tiny-llama"))
    assert [rc.model.name for _, rc in point_configs(cfg, study)] == ["tiny-qwen3", "tiny-llama"]
