"""Decoder models over the paged KV cache. One implementation serves Qwen3, Qwen2 and Llama
checkpoints (see arch.ModelArch for the switches); presets.py turns the named shapes of
engine.core.model_shapes into the config.json the checkpoint writer ships."""

from engine.models.arch import ModelArch
from engine.models.qwen3 import Qwen3ForCausalLM

__all__ = ["ModelArch", "Qwen3ForCausalLM"]
