"""Checkpoint folders as transformers' save_pretrained writes them: weights and config.json, no
tokenizer. Token-id prompts are served like transformers' generate; the end of sequence comes only
from the folder's configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine import LLM, SamplingParams


def _save_tiny(family: str, out: Path, **overrides: Any) -> None:
    import transformers

    config = getattr(transformers, f"{family}Config")(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        intermediate_size=96, vocab_size=1000, max_position_embeddings=256, **overrides)
    torch.manual_seed(0)
    getattr(transformers, f"{family}ForCausalLM")(config).float().save_pretrained(out)


@pytest.mark.parametrize("family", ["Qwen3", "Llama"])
def test_folder_without_tokenizer_serves_token_ids(family: str, tmp_path: Path) -> None:
    # Qwen's config sets no end of sequence: transformers' generate never stops early, and neither
    # may the engine (an empty placeholder tokenizer once made id 0 its end of sequence).
    _save_tiny(family, tmp_path, bos_token_id=None, eos_token_id=None)
    assert not list(tmp_path.glob("tokenizer*")) and not (tmp_path / "vocab.json").exists()
    llm = LLM(tmp_path, device="cpu", max_model_len=64)
    assert llm.executor.info().eos_token_ids == ()
    outs = llm.generate([[5, 6, 7], "text"], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(outs[0].token_ids) == 4 and outs[0].text == "" and outs[0].error is None
    assert "has none: pass token ids" in outs[1].error
