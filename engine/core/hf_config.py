"""Reading a Hugging Face config.json into ModelShape's fields (ModelShape.from_hf_config).

A key left out means ModelShape's default, or for the attention's shape the plain derivation (as
many KV heads as heads, head_dim = hidden_size / heads); these are not always a transformers config
class's own defaults (Qwen3Config's head_dim is 128), but a config.json written by save_pretrained has
every key. A value this project cannot serve raises a ValueError naming it. Plain data, so the
simulator reads a config without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from engine.core.architectures import ARCHITECTURES

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1}
_REQUIRED_HF_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")


class HasToDict(Protocol):
    """A transformers PretrainedConfig, as far as it is read here."""

    def to_dict(self) -> dict[str, Any]: ...


def shape_fields(config: Mapping[str, Any] | HasToDict, name: str | None,
                 defaults: Mapping[str, Any]) -> dict[str, Any]:
    """ModelShape's fields from a config.json (the dict, or a transformers PretrainedConfig);
    defaults: ModelShape's field defaults, what a config.json without a key means."""
    cfg: Mapping[str, Any] = config if isinstance(config, Mapping) else config.to_dict()
    model_type = _check(cfg)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or defaults["dtype"]).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"config torch_dtype={dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    # a switch the family's config class does not have is off, whatever the file says
    switches = ARCHITECTURES.get(model_type).config_keys
    return dict(
        name=str(name or cfg.get("_name_or_path") or model_type),
        num_layers=int(cfg["num_hidden_layers"]),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        model_type=model_type,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", defaults["tie_word_embeddings"])),
        dtype=dtype,
        max_position_embeddings=int(cfg.get("max_position_embeddings") or defaults["max_position_embeddings"]),
        rope_theta=_rope_theta(cfg, defaults["rope_theta"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps") or defaults["rms_norm_eps"]),
        attention_bias="attention_bias" in switches and bool(cfg.get("attention_bias", False)),
        mlp_bias="mlp_bias" in switches and bool(cfg.get("mlp_bias", False)),
        **_experts(cfg, switches, defaults),
    )


def _check(cfg: Mapping[str, Any]) -> str:
    """The config's model_type; ValueError for a config this project cannot serve."""
    missing = [key for key in _REQUIRED_HF_KEYS if key not in cfg]
    if missing:
        raise ValueError(f"config lacks {missing}: not a config.json of a {list(ARCHITECTURES.names())} model")
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise ValueError(f"config model_type={model_type!r} is not supported; expected one of "
                         f"{list(ARCHITECTURES.names())}")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act={cfg['hidden_act']!r} is not supported; expected 'silu'")
    if cfg.get("use_sliding_window"):
        raise ValueError("config use_sliding_window=true is not supported; expected false")
    return model_type


def _experts(cfg: Mapping[str, Any], switches: tuple[str, ...], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The mixture-of-experts fields of a config.json whose family has them (none for dense ones)."""
    if "num_experts" not in switches:
        return {}
    return dict(
        # transformers 5's PretrainedConfig.to_dict spells it num_local_experts (an attribute_map alias)
        num_experts=int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0),
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
        decoder_sparse_step=int(cfg.get("decoder_sparse_step") or 1),
        mlp_only_layers=tuple(int(i) for i in cfg.get("mlp_only_layers") or ()),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", defaults["norm_topk_prob"])),
    )


def _rope_theta(cfg: Mapping[str, Any], default: float) -> float:
    # transformers 4.x writes rope_theta (+ rope_scaling); 5.x folds both into rope_parameters.
    for key in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(key) or {}
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        if rope_type != "default":
            raise ValueError(f"config {key} of rope_type {rope_type!r} is not supported (no RoPE scaling); "
                             "expected 'default'")
    return float((cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or default)
