"""The simulator's ModelSpec and the checkpoint the engine loads agree on every shape field,
for every named model, because both derive from engine.core.model_shapes; each model_type is
built as its own class, found through ARCHITECTURES."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from engine.checkpoint import main, write_checkpoint
from engine.core.architectures import ARCHITECTURES
from engine.core.model_shapes import MODEL_SHAPES, RENAMED, ModelShape
from engine.models import build_model, model_class
from engine.models.presets import hf_config, hf_tensor_shapes, preset_config
from sim.specs import ModelSpec

TINY = sorted(name for name in MODEL_SHAPES if name.startswith("tiny-"))


def test_the_simulators_spec_is_the_description_plus_the_caches_dtype():
    # a field added to ModelShape is a ModelSpec field (and a conf/model override) without a second list
    spec_fields = [f.name for f in dataclasses.fields(ModelSpec)]
    assert spec_fields == [f.name for f in dataclasses.fields(ModelShape)] + ["kv_cache_dtype"]


def _assert_agree(config: dict, spec: ModelSpec) -> None:
    # The engine reads config.json with ModelShape.from_hf_config; the simulator's spec of the
    # same file must be the named model's spec, field for field (dtype too).
    assert ModelSpec.from_hf_config(config, name=spec.name) == spec
    shape = ModelShape.from_hf_config(config, name=spec.name)
    assert ModelSpec.from_shape(shape) == spec and shape.dtype_bytes == spec.dtype_bytes


@pytest.mark.parametrize("name", TINY)
def test_written_checkpoint_has_the_simulators_shape(name, tmp_path):
    spec = ModelSpec.from_shape(MODEL_SHAPES[name])
    out = write_checkpoint(name, tmp_path / name)
    config = json.loads((out / "config.json").read_text())
    _assert_agree(config, spec)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["model.embed_tokens.weight"] == (spec.vocab_size, spec.hidden_size)
    assert ("lm_head.weight" in shapes) == (not spec.tie_word_embeddings)
    layers = {int(k.split(".")[2]) for k in shapes if k.startswith("model.layers.")}
    assert layers == set(range(spec.num_layers))
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (spec.num_kv_heads * spec.head_dim, spec.hidden_size)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (spec.hidden_size, spec.intermediate_size)


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_preset_config_has_the_simulators_shape(name):
    _assert_agree(preset_config(name), ModelSpec.from_shape(MODEL_SHAPES[name]))


@pytest.mark.parametrize("name", sorted(MODEL_SHAPES))
def test_simulator_counts_the_checkpoints_parameters(name):
    tensors = hf_tensor_shapes(ModelShape.from_hf_config(preset_config(name)))
    assert sum(math.prod(shape) for _, shape in tensors) == ModelSpec.from_shape(MODEL_SHAPES[name]).num_params


@pytest.mark.parametrize("name, switches", [
    ("tiny-qwen2", {}), ("tiny-llama", {}), ("tiny-llama", {"attention_bias": True, "mlp_bias": True}),
    ("tiny-qwen3", {"attention_bias": True}), ("tiny-qwen3-moe", {"attention_bias": True})])
def test_simulator_counts_transformers_parameters(name, switches):
    # biases and q/k norms as each family has them, counted by transformers itself
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dataclasses.replace(MODEL_SHAPES[name], **switches)
    config = AutoConfig.for_model(**{k: v for k, v in hf_config(shape).items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == ModelSpec.from_shape(shape).num_params


@settings(max_examples=60, deadline=None)
@given(
    model_type=st.sampled_from(["qwen3", "qwen2", "llama"]),
    num_layers=st.integers(1, 96), kv_heads=st.integers(1, 16), group=st.integers(1, 8),
    head_dim=st.sampled_from([8, 64, 80, 128, 256]), hidden=st.integers(1, 64).map(lambda k: 64 * k),
    intermediate=st.integers(1, 30_000), vocab=st.integers(1, 200_000), tied=st.booleans(),
    dtype=st.sampled_from(["bfloat16", "float16", "float32"]),
)
def test_any_shape_derives_the_same_spec_on_both_sides(
    model_type, num_layers, kv_heads, group, head_dim, hidden, intermediate, vocab, tied, dtype,
):
    shape = ModelShape(
        name="m", model_type=model_type, num_layers=num_layers, hidden_size=hidden, num_heads=kv_heads * group,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate, vocab_size=vocab,
        tie_word_embeddings=tied, dtype=dtype, max_position_embeddings=4096,
    )
    _assert_agree(hf_config(shape), ModelSpec.from_shape(shape))


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_other_spelling_of_a_preset_names_the_model(old, new, tmp_path, capsys):
    with pytest.raises(ValueError, match=f"preset='{old}': model '{old}' is spelled '{new}'"):
        write_checkpoint(old, tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", old, "--out", str(tmp_path / "cli")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    error_lines = [line for line in err.splitlines() if line.startswith("python -m engine.checkpoint: error")]
    assert len(error_lines) == 1 and f"--preset {new}" in error_lines[0]
    assert not (tmp_path / "cli").exists()


@pytest.mark.parametrize("name", TINY)
def test_each_model_type_builds_its_own_class(name):
    from engine.attention.registry import get_attention_backend

    shape = MODEL_SHAPES[name]
    model = build_model(preset_config(name), get_attention_backend("torch", "cpu"))
    assert type(model) is model_class(shape.model_type)
    assert type(model).__name__ == shape.architecture.hf_class == preset_config(name)["architectures"][0]
    assert model.shape == ModelShape.from_hf_config(preset_config(name)) and model.shape.model_type == shape.model_type
    attn = model.model.layers[0].self_attn
    assert (attn.q_norm is not None) == shape.qk_norm == (shape.model_type in ("qwen3", "qwen3_moe"))
    assert (attn.qkv_proj.bias is not None) == shape.qkv_bias == (shape.model_type == "qwen2")
    assert attn.o_proj.bias is None
    other = next(t for t in ARCHITECTURES.names() if t != shape.model_type)
    with pytest.raises(ValueError, match=f"cannot serve model_type='{shape.model_type}'"):
        model_class(other)(preset_config(name), get_attention_backend("torch", "cpu"))


def test_unknown_model_type_lists_the_known_ones():
    config = {**preset_config("tiny-llama"), "model_type": "mistral"}
    known = r"\['qwen3', 'qwen3_moe', 'qwen2', 'llama'\]"
    with pytest.raises(ValueError, match=rf"model_type='mistral' is not supported; expected one of {known}"):
        ModelShape.from_hf_config(config)
    with pytest.raises(ValueError, match=rf"^model_type must be one of {known}, got 'mistral'"):
        model_class("mistral")
    with pytest.raises(ValueError, match=r"ModelShape.model_type must be one of"):
        dataclasses.replace(MODEL_SHAPES["tiny-llama"], model_type="mistral")


@pytest.mark.parametrize("switch, model_type", [("attention_bias", "qwen2"), ("mlp_bias", "qwen3")])
def test_a_bias_switch_the_family_lacks_is_refused(switch, model_type):
    with pytest.raises(ValueError, match=f"{switch}: a {model_type} model has no such switch"):
        ModelShape("m", 2, 64, 4, 2, 16, 128, 512, model_type=model_type, **{switch: True})


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_attention_bias_puts_a_bias_on_all_four_projections(model_type):
    shape = ModelShape("m", 1, 64, 4, 2, 16, 128, 512, model_type=model_type, attention_bias=True)
    names = {n for n, _ in hf_tensor_shapes(shape)}
    assert {f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkvo"} <= names
    assert ModelShape.from_hf_config(hf_config(shape), name="m") == shape
