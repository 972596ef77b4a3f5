"""Decoder models over the paged KV cache, one class per architecture (decoder.py holds what they
share). engine.core.architectures.ARCHITECTURES names each architecture's class and module by its
Hugging Face model_type; build_model reads a config.json and builds the class it names. presets.py
turns the described models of engine.core.model_shapes into the checkpoint the writer ships."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from engine.attention.backend import AttentionBackend
from engine.core.architectures import ARCHITECTURES
from engine.core.model_shapes import ModelShape
from engine.layers.parallel import TensorParallel
from engine.models.decoder import DecoderForCausalLM


def model_class(model_type: str) -> type[DecoderForCausalLM]:
    """The engine's class for a Hugging Face model_type; ValueError lists the known ones. Its module
    is imported here, on first use, so a registration costs no import until a model needs it."""
    architecture = ARCHITECTURES.get(model_type)
    return getattr(importlib.import_module(architecture.module), architecture.hf_class)


def build_model(
    config: ModelShape | Mapping[str, Any] | Any,
    attention_backend: AttentionBackend,
    tp: TensorParallel | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> DecoderForCausalLM:
    """The model a config.json (dict or transformers PretrainedConfig) or a ModelShape describes,
    its parameters allocated but not loaded (engine.loader fills them)."""
    shape = config if isinstance(config, ModelShape) else ModelShape.from_hf_config(config)
    return model_class(shape.model_type)(shape, attention_backend, tp, dtype=dtype, device=device)


__all__ = ["DecoderForCausalLM", "build_model", "model_class"]
