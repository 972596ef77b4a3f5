"""Every decoder architecture the project serves, by Hugging Face model_type (ARCHITECTURES), and
what each changes in the decoder they share. Plain data: the engine finds its class here, the
simulator and engine.core.model_shapes read the switches without torch."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.registry import Registry


@dataclass(frozen=True)
class Architecture:
    """What one Hugging Face model_type changes in the decoder every architecture shares
    (pre-norm, RoPE, grouped-query attention, SwiGLU), and where the engine's class for it lives."""

    hf_class: str  # config.json's "architectures" entry, and the name of the engine's class
    module: str  # the engine module defining hf_class; only the engine imports it (torch)
    qk_norm: bool  # an RMSNorm over each head of q and of k, before the rotation
    fixed_qkv_bias: bool  # q/k/v always carry a bias and o never does; no attention_bias switch
    config_keys: tuple[str, ...]  # the optional config.json keys its Hugging Face config class has
    moe: bool = False  # its layers may route tokens to experts (ModelShape.num_experts > 0)


# Every architecture, by Hugging Face model_type. A new one is a module defining its class (see
# engine/models/llama.py) and one entry here; the engine finds the class through this entry.
ARCHITECTURES: Registry[Architecture] = Registry("model_type")
_QWEN_WINDOW = ("use_sliding_window", "sliding_window", "max_window_layers")
ARCHITECTURES.add("qwen3", Architecture(
    "Qwen3ForCausalLM", "engine.models.qwen3", qk_norm=True, fixed_qkv_bias=False,
    config_keys=(*_QWEN_WINDOW, "attention_bias", "attention_dropout", "rope_scaling")))
_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
             "mlp_only_layers", "norm_topk_prob")
ARCHITECTURES.add("qwen3_moe", Architecture(
    "Qwen3MoeForCausalLM", "engine.models.qwen3_moe", qk_norm=True, fixed_qkv_bias=False,
    config_keys=(*_QWEN_WINDOW, "attention_bias", "attention_dropout", "rope_scaling", *_MOE_KEYS), moe=True))
ARCHITECTURES.add("qwen2", Architecture(
    "Qwen2ForCausalLM", "engine.models.qwen2", qk_norm=False, fixed_qkv_bias=True, config_keys=_QWEN_WINDOW))
ARCHITECTURES.add("llama", Architecture(
    "LlamaForCausalLM", "engine.models.llama", qk_norm=False, fixed_qkv_bias=False,
    config_keys=("attention_bias", "mlp_bias")))
