"""Tiny random-weight checkpoints written once per test session (float32, a few hundred KB).

Other engine tests (runner, LLM facade) use these fixtures too: treat the directories as
read-only.
"""

from __future__ import annotations

import pytest

from engine.checkpoint import write_checkpoint


def _write(tmp_path_factory: pytest.TempPathFactory, preset: str):
    return write_checkpoint(preset, tmp_path_factory.mktemp(preset), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """Qwen3 layout: q/k norm, tied embeddings, 2 layers, hidden 64, 4 heads / 2 kv heads."""
    return _write(tmp_path_factory, "tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    """Qwen2 layout: q/k/v bias, no q/k norm, untied LM head."""
    return _write(tmp_path_factory, "tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """Llama layout: no biases, no q/k norm, 8 heads of dim 8 over 2 kv heads, untied."""
    return _write(tmp_path_factory, "tiny-llama")


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tmp_path_factory):
    """Qwen3-MoE layout from this project's writer: layer 0 dense, layers 1-2 route to 2 of 8 experts."""
    return _write(tmp_path_factory, "tiny-qwen3-moe")


@pytest.fixture(scope="session")
def hf_qwen3_moe_dir(tmp_path_factory):
    """The tiny-qwen3-moe shape as transformers itself initialises and saves it (save_pretrained),
    so the engine is checked against the layout transformers writes, not against its own writer.
    The router is redrawn with std 1: transformers initialises it to zeros, where every expert ties."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from engine.models.presets import preset_config

    torch.manual_seed(0)
    config = Qwen3MoeConfig(**{k: v for k, v in preset_config("tiny-qwen3-moe").items() if k != "architectures"})
    model = Qwen3MoeForCausalLM(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 1.0)
    out = tmp_path_factory.mktemp("hf-qwen3-moe")
    model.save_pretrained(out)
    return out
