"""LLM.generate where a vLLM user has expectations: how a request ends (finish_reason,
stop_reason), a max_tokens that max_model_len cuts short, and the LLM's lifetime."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    return LLM(tiny_qwen3_dir, device="cpu", max_model_len=32, block_size=8, max_num_batched_tokens=64)


def test_generate_after_shutdown_raises_and_shutdown_twice_is_harmless(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, device="cpu", max_model_len=32, block_size=8)
    assert llm.generate([1, 2], GREEDY, use_tqdm=False)[0].ok
    llm.shutdown()
    llm.shutdown()
    with pytest.raises(RuntimeError, match=r"LLM.generate\(\) after LLM.shutdown\(\)"):
        llm.generate([1, 2], GREEDY, use_tqdm=False)
