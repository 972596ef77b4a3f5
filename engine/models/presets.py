"""What a checkpoint of a described model (engine.core.model_shapes) holds: the config.json that
`python -m engine.checkpoint` writes, and the name and shape of each tensor.

The qwen3-* presets carry the published Qwen3 config.json values (Qwen/Qwen3-0.6B, -4B, -8B,
-32B); only the special-token ids differ, because the checkpoint ships its own small tokenizer.
The tiny-* presets are for tests: a few layers, a vocabulary the size of that tokenizer.
"""

from __future__ import annotations

from typing import Any

from engine.core.model_shapes import MODEL_SHAPES, ModelShape, model_shape

PRESETS: tuple[str, ...] = tuple(MODEL_SHAPES)


def _optional_keys(shape: ModelShape) -> dict[str, Any]:
    # The value of each optional key an architecture's config class may have
    # (Architecture.config_keys): sliding windows off, no dropout, no RoPE scaling.
    return {
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": shape.num_layers,
        "attention_bias": shape.attention_bias, "attention_dropout": 0.0, "rope_scaling": None,
        "mlp_bias": shape.mlp_bias,
        "num_experts": shape.num_experts, "num_experts_per_tok": shape.num_experts_per_tok,
        "moe_intermediate_size": shape.moe_intermediate_size, "decoder_sparse_step": shape.decoder_sparse_step,
        "mlp_only_layers": list(shape.mlp_only_layers), "norm_topk_prob": shape.norm_topk_prob,
    }


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """The Hugging Face config.json fields of `shape` (without special-token ids)."""
    architecture = shape.architecture
    cfg: dict[str, Any] = {
        "architectures": [architecture.hf_class],
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
    optional = _optional_keys(shape)
    cfg.update({key: optional[key] for key in architecture.config_keys})
    return cfg


def preset_config(name: str) -> dict[str, Any]:
    """A fresh copy of the preset's config.json fields (without special-token ids)."""
    try:
        return hf_config(model_shape(name))
    except ValueError as error:
        raise ValueError(f"preset={name!r}: {error}") from None


def hf_tensor_shapes(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the Hugging Face checkpoint, by its HF name, in layer order."""
    h, d = shape.hidden_size, shape.head_dim
    q_size, kv_size = shape.num_heads * d, shape.num_kv_heads * d
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape.vocab_size, h))]
    for i in range(shape.num_layers):
        p = f"model.layers.{i}"
        out.append((f"{p}.input_layernorm.weight", (h,)))
        for proj, size in (("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)):
            out.append((f"{p}.self_attn.{proj}.weight", (size, h)))
            if shape.qkv_bias:
                out.append((f"{p}.self_attn.{proj}.bias", (size,)))
        out.append((f"{p}.self_attn.o_proj.weight", (h, q_size)))
        if shape.o_bias:
            out.append((f"{p}.self_attn.o_proj.bias", (h,)))
        if shape.qk_norm:
            out.append((f"{p}.self_attn.q_norm.weight", (d,)))
            out.append((f"{p}.self_attn.k_norm.weight", (d,)))
        out.append((f"{p}.post_attention_layernorm.weight", (h,)))
        if shape.is_moe_layer(i):
            out += _expert_tensor_shapes(shape, f"{p}.mlp")
            continue
        for proj, dims in (
            ("gate_proj", (shape.intermediate_size, h)),
            ("up_proj", (shape.intermediate_size, h)),
            ("down_proj", (h, shape.intermediate_size)),
        ):
            out.append((f"{p}.mlp.{proj}.weight", dims))
            if shape.mlp_bias:
                out.append((f"{p}.mlp.{proj}.bias", dims[:1]))
    out.append(("model.norm.weight", (h,)))
    if not shape.tie_word_embeddings:
        out.append(("lm_head.weight", (shape.vocab_size, h)))
    return out


def _expert_tensor_shapes(shape: ModelShape, mlp: str) -> list[tuple[str, tuple[int, ...]]]:
    """A sparse layer's router and its experts, one tensor per projection (the published layout)."""
    h, i = shape.hidden_size, shape.moe_intermediate_size
    out: list[tuple[str, tuple[int, ...]]] = [(f"{mlp}.gate.weight", (shape.num_experts, h))]
    for e in range(shape.num_experts):
        out += [(f"{mlp}.experts.{e}.gate_proj.weight", (i, h)), (f"{mlp}.experts.{e}.up_proj.weight", (i, h)),
                (f"{mlp}.experts.{e}.down_proj.weight", (h, i))]
    return out
