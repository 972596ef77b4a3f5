"""The simulator's ModelSpec and the checkpoint the engine loads agree on every shape field,
for every named model, because both derive from engine.core.model_shapes."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from engine.checkpoint import main, write_checkpoint
from engine.core.model_shapes import MODEL_SHAPES, RENAMED, ModelShape
from engine.models.arch import ModelArch, hf_tensor_shapes
from engine.models.presets import hf_config, preset_config
from sim.specs import ModelSpec

# ModelSpec field -> ModelArch field (the loader's reading of config.json)
ARCH_FIELD = {
    "num_layers": "num_layers", "hidden_size": "hidden_size", "num_heads": "num_heads",
    "num_kv_heads": "num_kv_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size", "tie_word_embeddings": "tie_word_embeddings",
}
SHAPE_FIELDS = {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}
TINY = sorted(name for name in MODEL_SHAPES if name.startswith("tiny-"))


def test_every_spec_field_but_the_width_is_read_by_the_loader():
    # dtype_bytes is compared through torch_dtype; kv_cache_dtype is the cache's (CacheConfig), not the checkpoint's
    assert SHAPE_FIELDS - set(ARCH_FIELD) == {"dtype_bytes", "kv_cache_dtype"}


def _assert_agree(config: dict, spec: ModelSpec) -> None:
    arch = ModelArch.from_hf_config(config)
    for spec_field, arch_field in ARCH_FIELD.items():
        assert getattr(arch, arch_field) == getattr(spec, spec_field), spec_field
    assert ModelSpec.from_hf_config(config, name=spec.name) == spec  # dtype_bytes too


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


@pytest.mark.parametrize("name", sorted(n for n, s in MODEL_SHAPES.items() if s.model_type == "qwen3"))
def test_simulator_counts_the_checkpoints_parameters(name):
    # Qwen3 has q/k norms and no biases, exactly the tensors ModelSpec counts.
    tensors = hf_tensor_shapes(ModelArch.from_hf_config(preset_config(name)))
    assert sum(math.prod(shape) for _, shape in tensors) == ModelSpec.from_shape(MODEL_SHAPES[name]).num_params


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
