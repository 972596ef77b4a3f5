"""Qwen3 (model_type "qwen3"): the shared decoder with an RMSNorm over each head of q and k before
the rotation, and no biases unless the config sets attention_bias (engine.core.model_shapes)."""

from __future__ import annotations

from engine.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    pass
