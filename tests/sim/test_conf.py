"""Every conf/model and conf/hardware YAML loads into its spec, with exactly the spec's fields."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from sim.specs import HardwareSpec, ModelSpec
from tests.sim.helpers import CONF

MODEL_FILES = sorted((CONF / "model").glob("*.yaml"))
HARDWARE_FILES = sorted((CONF / "hardware").glob("*.yaml"))


def test_expected_files_exist():
    assert {p.stem for p in MODEL_FILES} >= {"qwen3_0_6b", "qwen3_4b", "qwen3_8b", "qwen3_32b", "tiny"}
    assert {p.stem for p in HARDWARE_FILES} >= {"h100", "h200", "a100", "cpu"}


@pytest.mark.parametrize("path", MODEL_FILES + HARDWARE_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_yaml_has_exactly_the_spec_fields_and_loads(path):
    cls = ModelSpec if path.parent.name == "model" else HardwareSpec
    data = yaml.safe_load(path.read_text())
    assert set(data) == {f.name for f in dataclasses.fields(cls)}
    spec = cls(**data)
    for key, value in data.items():
        assert getattr(spec, key) == value  # no key was silently coerced from a string


@pytest.mark.parametrize("stem, preset", [
    ("qwen3_0_6b", "qwen3-0.6b"), ("qwen3_4b", "qwen3-4b"), ("qwen3_8b", "qwen3-8b"), ("qwen3_32b", "qwen3-32b"),
    ("tiny", "tiny-qwen3"),
])
def test_model_yaml_matches_engine_checkpoint_preset(stem, preset):
    presets = pytest.importorskip("engine.models.presets")
    spec = ModelSpec(**yaml.safe_load((CONF / "model" / f"{stem}.yaml").read_text()))
    from_preset = ModelSpec.from_hf_config(presets.preset_config(preset), name=spec.name)
    assert from_preset == spec
