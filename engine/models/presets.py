"""The config.json that `python -m engine.checkpoint` writes for each model of
engine.core.model_shapes (the one source of model shape; the simulator's ModelSpec reads it too).

The qwen3-* presets carry the published Qwen3 config.json values (Qwen/Qwen3-0.6B, -4B, -8B,
-32B); only the special-token ids differ, because the checkpoint ships its own small tokenizer.
The tiny-* presets are for tests: a few layers, a vocabulary the size of that tokenizer.
"""

from __future__ import annotations

from typing import Any

from engine.core.model_shapes import MODEL_SHAPES, ModelShape, model_shape

_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
PRESETS: tuple[str, ...] = tuple(MODEL_SHAPES)


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """The Hugging Face config.json fields of `shape` (without special-token ids)."""
    cfg: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[shape.model_type]],
        "model_type": shape.model_type,
        "num_hidden_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": shape.dtype,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": shape.rms_norm_eps,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if shape.model_type in ("qwen3", "qwen2"):
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=shape.num_layers)
    if shape.model_type in ("qwen3", "llama"):
        # Qwen2 has no such switch: its q/k/v always carry a bias (engine.models.arch).
        cfg["attention_bias"] = False
    if shape.model_type == "qwen3":
        cfg.update(attention_dropout=0.0, rope_scaling=None)
    if shape.model_type == "llama":
        cfg["mlp_bias"] = False
    return cfg


def preset_config(name: str) -> dict[str, Any]:
    """A fresh copy of the preset's config.json fields (without special-token ids)."""
    try:
        return hf_config(model_shape(name))
    except ValueError as error:
        raise ValueError(f"preset={name!r}: {error}") from None
