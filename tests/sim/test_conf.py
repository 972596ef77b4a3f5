"""Every conf/hardware YAML loads into its spec; every conf/model YAML names one model of
engine.core.model_shapes, under that model's one spelling."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from engine.core.model_shapes import MODEL_SHAPES, RENAMED
from sim.specs import HardwareSpec, ModelSpec, preset_fields
from tests.sim.helpers import CONF

MODEL_FILES = sorted((CONF / "model").glob("*.yaml"))
HARDWARE_FILES = sorted((CONF / "hardware").glob("*.yaml"))


def test_expected_files_exist():
    assert {p.stem for p in HARDWARE_FILES} >= {"h100", "h200", "a100", "cpu"}


def test_every_model_has_a_conf_file_and_every_conf_file_a_model():
    assert {p.stem for p in MODEL_FILES} == set(MODEL_SHAPES) | set(RENAMED)
    assert not set(MODEL_SHAPES) & set(RENAMED)


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: p.stem)
def test_model_yaml_names_its_own_preset_and_repeats_no_number(path):
    # The other spelling's files name themselves too, so that composing one reaches the error
    # that names the model's spelling.
    assert yaml.safe_load(path.read_text()) == {"preset": path.stem}


@pytest.mark.parametrize("path", HARDWARE_FILES, ids=lambda p: p.stem)
def test_hardware_yaml_has_exactly_the_spec_fields_and_loads(path):
    data = yaml.safe_load(path.read_text())
    assert set(data) == {f.name for f in dataclasses.fields(HardwareSpec)}
    spec = HardwareSpec(**data)
    for key, value in data.items():
        assert getattr(spec, key) == value  # no key was silently coerced from a string


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_model_spec_carries_every_shape_field_of_its_model(name):
    shape = MODEL_SHAPES[name]
    spec = ModelSpec.from_shape(shape)
    for f in dataclasses.fields(ModelSpec):
        if f.name == "kv_cache_dtype":  # the cache's setting, not the model's: the model's own dtype
            assert spec.kv_cache_dtype == "auto"
            continue
        assert getattr(spec, f.name) == getattr(shape, f.name), f.name
    assert spec.dtype_bytes == shape.dtype_bytes
    assert preset_fields(name) == dataclasses.asdict(spec)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_other_spelling_is_an_error_naming_the_model(old, new):
    with pytest.raises(ValueError, match=f"model '{old}' is spelled '{new}'"):
        preset_fields(old)


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"'qwen9' is unknown; expected one of \[.*'tiny-llama'"):
        preset_fields("qwen9")
