"""Llama (model_type "llama"): the shared decoder without q/k norm; attention_bias and mlp_bias
switch biases on (engine.core.model_shapes).

A new architecture is a module like this one, with its class (overriding what its decoder does
differently), plus one entry in engine.core.architectures.ARCHITECTURES that names the class and
this module; engine.models.build_model then serves checkpoints whose config.json has its
model_type."""

from __future__ import annotations

from engine.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    pass
