"""EngineConfig and ExecutionConfig validation and the executor's device / dtype / eos resolution (no model needed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig
from engine.core.config import ExecutionConfig
from engine.preflight import read_eos_token_ids, resolve_device
from engine.rank import resolve_dtype


def test_defaults_are_valid():
    config = EngineConfig(model="/ckpt")
    assert (config.dtype, config.device, config.attention_backend) == ("auto", "auto", "auto")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("gpu_memory_utilization", 0.0, r"gpu_memory_utilization must be a number in \(0, 1\]"),
        ("gpu_memory_utilization", 1.5, r"gpu_memory_utilization must be a number in \(0, 1\]"),
        ("gpu_memory_utilization", True, "gpu_memory_utilization"),
        ("tensor_parallel_size", 0, "tensor_parallel_size must be an int >= 1"),
        ("tensor_parallel_size", 2.0, "tensor_parallel_size must be an int >= 1"),
        ("seed", -1, r"seed must be an int in \[0, 2\*\*63\)"),
        ("seed", 2**63, "seed must be an int"),
    ],
)
def test_invalid_execution_fields_name_the_field_and_range(field, value, message):
    with pytest.raises(ValueError, match=f"ExecutionConfig.{message}"):
        ExecutionConfig(**{field: value})


@pytest.mark.parametrize("field, value, message", [
    ("dtype", "fp8", "dtype must be one of"),
    ("device", "tpu", "device must be one of"),
    ("attention_backend", "xformers", "attention_backend must be one of"),
])
def test_invalid_fields_name_the_field_and_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="/ckpt", **{field: value})


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_async_scheduling_is_typed_and_resolved_by_the_device_at_any_tp(tp):
    auto = ExecutionConfig(tensor_parallel_size=tp)
    assert auto.overlaps_steps(on_cuda=True) and not auto.overlaps_steps(on_cuda=False)
    assert ExecutionConfig(async_scheduling=True, tensor_parallel_size=tp).overlaps_steps(on_cuda=False)
    assert not ExecutionConfig(async_scheduling=False, tensor_parallel_size=tp).overlaps_steps(on_cuda=True)
    with pytest.raises(TypeError, match="async_scheduling must be true, false or null"):
        ExecutionConfig(async_scheduling="on", tensor_parallel_size=tp)


def test_invalid_model_and_flag_types():
    with pytest.raises(ValueError, match="model must be a non-empty path"):
        EngineConfig(model="")
    with pytest.raises(TypeError, match="enforce_eager must be a bool"):
        ExecutionConfig(enforce_eager="yes")
    with pytest.raises(TypeError, match="balanced_decode must be a bool"):
        EngineConfig(model="/ckpt", balanced_decode="no")


def test_config_is_frozen():
    config = EngineConfig(model="/ckpt")
    with pytest.raises(AttributeError):
        config.execution = ExecutionConfig(seed=3)


def test_device_and_dtype_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            resolve_device("cuda")
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is None  # the checkpoint's own
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


def test_eos_ids_generation_config_first_then_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 3]}))
    assert read_eos_token_ids(tmp_path, SimpleNamespace(eos_token_id=9)) == (7, 3, 9)
    assert read_eos_token_ids(tmp_path, SimpleNamespace(eos_token_id=3)) == (7, 3)
    (tmp_path / "generation_config.json").unlink()
    assert read_eos_token_ids(tmp_path, SimpleNamespace(eos_token_id=9)) == (9,)
    assert read_eos_token_ids(tmp_path, SimpleNamespace()) == ()
