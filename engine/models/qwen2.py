"""Qwen2 (model_type "qwen2"): the shared decoder with a bias on q, k and v (never on o) and no
q/k norm (engine.core.model_shapes)."""

from __future__ import annotations

from engine.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    pass
