"""The few numbers and switches that define a dense decoder, read from a Hugging Face config.

Qwen3, Qwen2 and Llama differ only in small ways here: Qwen3 normalises q and k per head,
Qwen2 has a bias on q/k/v (not on o), Llama and Qwen3 put a bias on all four projections only
when `attention_bias` is set. Everything else (pre-norm, RoPE, GQA, SwiGLU) is shared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


@dataclass(frozen=True)
class ModelArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelArch:
        """Accepts a transformers PretrainedConfig or the plain dict of a config.json."""
        cfg: Mapping[str, Any] = config.to_dict() if hasattr(config, "to_dict") else dict(config)
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"config model_type={model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config hidden_act={cfg['hidden_act']!r} is not supported; expected 'silu'")
        if cfg.get("use_sliding_window"):
            raise ValueError("config use_sliding_window=true is not supported; expected false")
        num_heads = int(cfg["num_attention_heads"])
        num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
        hidden_size = int(cfg["hidden_size"])
        if num_heads % num_kv_heads:
            raise ValueError(
                f"config num_attention_heads={num_heads} must be a multiple of num_key_value_heads={num_kv_heads}"
            )
        attention_bias = bool(cfg.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden_size,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=int(cfg.get("head_dim") or hidden_size // num_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(cfg),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=attention_bias or model_type == "qwen2",
            o_bias=attention_bias and model_type != "qwen2",
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
        )


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    # transformers 4.x writes rope_theta (+ rope_scaling); 5.x folds both into rope_parameters.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ValueError(f"config rope type {rope_type!r} is not supported; expected 'default'")
    return float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)


def hf_tensor_shapes(arch: ModelArch) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the Hugging Face checkpoint, by its HF name, in layer order."""
    h, d = arch.hidden_size, arch.head_dim
    q_size, kv_size = arch.num_heads * d, arch.num_kv_heads * d
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (arch.vocab_size, h))]
    for i in range(arch.num_layers):
        p = f"model.layers.{i}"
        out.append((f"{p}.input_layernorm.weight", (h,)))
        for proj, size in (("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)):
            out.append((f"{p}.self_attn.{proj}.weight", (size, h)))
            if arch.qkv_bias:
                out.append((f"{p}.self_attn.{proj}.bias", (size,)))
        out.append((f"{p}.self_attn.o_proj.weight", (h, q_size)))
        if arch.o_bias:
            out.append((f"{p}.self_attn.o_proj.bias", (h,)))
        if arch.qk_norm:
            out.append((f"{p}.self_attn.q_norm.weight", (d,)))
            out.append((f"{p}.self_attn.k_norm.weight", (d,)))
        out.append((f"{p}.post_attention_layernorm.weight", (h,)))
        for proj, shape in (
            ("gate_proj", (arch.intermediate_size, h)),
            ("up_proj", (arch.intermediate_size, h)),
            ("down_proj", (h, arch.intermediate_size)),
        ):
            out.append((f"{p}.mlp.{proj}.weight", shape))
            if arch.mlp_bias:
                out.append((f"{p}.mlp.{proj}.bias", shape[:1]))
    out.append(("model.norm.weight", (h,)))
    if not arch.tie_word_embeddings:
        out.append(("lm_head.weight", (arch.vocab_size, h)))
    return out
