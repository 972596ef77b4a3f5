"""LLM.generate where a vLLM user has expectations: how a request ends (finish_reason,
stop_reason), a max_tokens that max_model_len cuts short, and the LLM's lifetime."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    return LLM(tiny_qwen3_dir, device="cpu", max_model_len=32, block_size=8, max_num_batched_tokens=64)


def test_stop_token_reports_stop_and_the_token(llm):
    prompt = [5, 6, 7]
    first = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert first.finish_reason == "length" and first.stop_reason is None
    stop = first.token_ids[0]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, stop_token_ids=[stop])
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert out.token_ids == [stop] and out.finish_reason == "stop" and out.stop_reason == stop


def test_max_tokens_past_max_model_len_is_cut_at_the_limit(llm):
    # vLLM's offline LLM serves such a request up to max_model_len and reports "length"
    params = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=20, ignore_eos=True)
    out = llm.generate([[1] * 26, [2] * 4], params, use_tqdm=False)
    assert out[0].ok and len(out[0].token_ids) == 32 - 26 and out[0].finish_reason == "length"
    assert out[1].ok and len(out[1].token_ids) == 20
    full = llm.generate([[1] * 32], params, use_tqdm=False)[0]
    assert not full.ok and "leaves no room to generate" in full.error


def test_generate_after_shutdown_raises_and_shutdown_twice_is_harmless(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, device="cpu", max_model_len=32, block_size=8)
    assert llm.generate([1, 2], GREEDY, use_tqdm=False)[0].ok
    llm.shutdown()
    llm.shutdown()
    with pytest.raises(RuntimeError, match=r"LLM.generate\(\) after LLM.shutdown\(\)"):
        llm.generate([1, 2], GREEDY, use_tqdm=False)


def test_a_model_path_that_is_a_file_is_named_as_one(tiny_qwen3_dir):
    with pytest.raises(FileNotFoundError, match="config.json is a file, not a model directory"):
        LLM(tiny_qwen3_dir / "config.json", device="cpu")
