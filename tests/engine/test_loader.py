"""load_model: what a broken checkpoint directory produces, and sharded / dtype loading."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint import write_checkpoint
from engine.loader import load_model


@pytest.fixture
def ckpt(tiny_qwen3_dir, tmp_path):
    """A private, editable copy of the tiny Qwen3 checkpoint: (dir, its tensors)."""
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_qwen3_dir, d)
    return d, load_file(d / "model.safetensors")


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        load_model(tmp_path / "nope")


def test_missing_config_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path)


def test_missing_tensor_is_named(ckpt):
    d, tensors = ckpt
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    # one shard of the fused qkv parameter is absent although q and v filled the rest
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_model(d)


def test_unexpected_tensor_is_named_with_its_file(ckpt):
    d, tensors = ckpt
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.safetensors: unexpected tensor 'model\.layers\.0\.mlp\.extra_proj"):
        load_model(d)


@pytest.mark.parametrize(
    "name,shape",
    [
        ("model.layers.0.self_attn.q_proj.weight", (64, 63)),
        ("model.layers.1.mlp.down_proj.weight", (64, 127)),
        ("model.norm.weight", (65,)),
        ("model.embed_tokens.weight", (511, 64)),
    ],
)
def test_shape_mismatch_names_file_tensor_and_shapes(ckpt, name, shape):
    d, tensors = ckpt
    tensors[name] = torch.zeros(shape)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{name}': shape mismatch: checkpoint has"):
        load_model(d)


def test_weights_are_the_checkpoint_tensors(ckpt):
    d, tensors = ckpt
    model, hf_config = load_model(d)
    assert hf_config.model_type == "qwen3" and hf_config.vocab_size == 512
    attn = model.model.layers[1].self_attn
    q, k, v = attn.qkv_proj.weight.split([64, 32, 32])
    assert torch.equal(q, tensors["model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(v, tensors["model.layers.1.self_attn.v_proj.weight"])
    gate, up = model.model.layers[0].mlp.gate_up_proj.weight.chunk(2)
    assert torch.equal(up, tensors["model.layers.0.mlp.up_proj.weight"])
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied


def test_sharded_checkpoint_loads_the_same_weights(tmp_path, tiny_qwen2_dir):
    d = write_checkpoint("tiny-qwen2", tmp_path / "sharded", max_shard_bytes=100_000)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (d / "model.safetensors").exists()
    sharded, _ = load_model(d)
    single, _ = load_model(tiny_qwen2_dir)
    for (name, a), (_, b) in zip(sharded.named_parameters(), single.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    (d / files[1]).unlink()
    with pytest.raises(FileNotFoundError, match=files[1]):
        load_model(d)


def test_dtype_from_config_and_override_errors(ckpt):
    d, _ = ckpt
    cfg = json.loads((d / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (d / "config.json").write_text(json.dumps(cfg))
    model, _ = load_model(d)
    assert model.lm_head.weight.dtype == torch.bfloat16
    model, _ = load_model(d, dtype=torch.float16)
    assert model.lm_head.weight.dtype == torch.float16
    with pytest.raises(ValueError, match="dtype='int8'.*expected one of"):
        load_model(d, dtype="int8")
    cfg["torch_dtype"] = "float64"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="torch_dtype in .*config.json='float64'"):
        load_model(d)


def test_unsupported_architecture_is_rejected(ckpt):
    d, _ = ckpt
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        load_model(d)


@pytest.mark.parametrize("key", ["rope_scaling", "rope_parameters"])
def test_rope_scaling_is_refused_naming_its_key(ckpt, key):
    d, _ = ckpt
    cfg = json.loads((d / "config.json").read_text())
    cfg[key] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 10000.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config rope_(scaling|parameters) of rope_type 'llama3' is not supp"):
        load_model(d)
