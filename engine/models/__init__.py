"""Decoder models over the paged KV cache. One implementation serves Qwen3, Qwen2 and Llama
checkpoints (see arch.ModelArch for the switches); presets.py holds shapes for checkpoints."""

from engine.models.arch import ModelArch
from engine.models.qwen3 import Qwen3ForCausalLM

__all__ = ["ModelArch", "Qwen3ForCausalLM"]
