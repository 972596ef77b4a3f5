"""Model shapes that `python -m engine.checkpoint` can write.

The qwen3-* presets carry the published Qwen3 config.json values (Qwen/Qwen3-0.6B, -4B, -8B,
-32B); only the special-token ids differ, because the checkpoint ships its own small tokenizer.
The tiny-* presets are for tests: a few layers, a vocabulary the size of that tokenizer.
"""

from __future__ import annotations

from typing import Any

from engine.tokenizer_builder import TOKENIZER_SIZE

_QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def _qwen3(layers: int, hidden: int, heads: int, intermediate: int, tied: bool) -> dict[str, Any]:
    return {
        **_QWEN3_COMMON,
        "num_hidden_layers": layers,
        "max_window_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "tie_word_embeddings": tied,
    }


def _tiny(model_type: str, architecture: str, **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "initializer_range": 0.02,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": TOKENIZER_SIZE,
    }
    cfg.update(overrides)
    return cfg


PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": _qwen3(28, 1024, 16, 3072, tied=True),
    "qwen3-4b": _qwen3(36, 2560, 32, 9728, tied=True),
    "qwen3-8b": _qwen3(36, 4096, 32, 12288, tied=False),
    "qwen3-32b": _qwen3(64, 5120, 64, 25600, tied=False),
    # Tied embeddings and q/k norm, like Qwen3-0.6B.
    "tiny-qwen3": _tiny(
        "qwen3", "Qwen3ForCausalLM", attention_bias=False, tie_word_embeddings=True,
        use_sliding_window=False, sliding_window=None, max_window_layers=2,
    ),
    # Qwen2: bias on q/k/v, no q/k norm; untied here so both head layouts are exercised.
    "tiny-qwen2": _tiny(
        "qwen2", "Qwen2ForCausalLM", tie_word_embeddings=False,
        use_sliding_window=False, sliding_window=None, max_window_layers=2,
    ),
    # Llama 3 style: no biases, no q/k norm, its own theta and eps.
    "tiny-llama": _tiny(
        "llama", "LlamaForCausalLM", attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
        rope_theta=500000.0, rms_norm_eps=1e-5, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
    ),
}


def preset_config(name: str) -> dict[str, Any]:
    """A fresh copy of the preset's config.json fields (without special-token ids)."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; expected one of {sorted(PRESETS)}")
    return dict(PRESETS[name])
