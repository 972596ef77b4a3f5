"""LLM.generate's input handling: prompt forms, output order, and bad input.

A bad request comes back with `error` naming the problem while the rest of the call is served;
a bad call (no prompts, mismatched or mistyped sampling params, unknown config) raises.
"""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.core.plan import StepStats
from engine.outputs import ThroughputMeter

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    return LLM(tiny_qwen3_dir, device="cpu", max_model_len=32, block_size=8, max_num_batched_tokens=64)


def test_prompt_forms_and_input_order(llm):
    text = "Hello there"
    single_text = llm.generate(text, PARAMS, use_tqdm=False)
    single_ids = llm.generate([5, 6, 7], PARAMS, use_tqdm=False)
    assert len(single_text) == len(single_ids) == 1
    assert single_text[0].prompt == text
    assert single_text[0].prompt_token_ids == llm.tokenizer.encode(text)
    assert single_ids[0].prompt is None and single_ids[0].prompt_token_ids == [5, 6, 7]
    batch = [[9, 8, 7, 6, 5, 4, 3], text, (5, 6, 7), [42]]
    outputs = llm.generate(batch, PARAMS, use_tqdm=False)
    assert [o.prompt_token_ids for o in outputs] == [[9, 8, 7, 6, 5, 4, 3], llm.tokenizer.encode(text), [5, 6, 7], [42]]
    # the same prompt gives the same greedy tokens whatever call it came in
    assert outputs[1].token_ids == single_text[0].token_ids and outputs[2].token_ids == single_ids[0].token_ids
    for o in outputs:
        assert o.ok and o.finish_reason == "length" and len(o.token_ids) == 4
        assert o.text == llm.tokenizer.decode(o.token_ids, skip_special_tokens=True)
    assert len({o.request_id for o in single_text + single_ids + outputs}) == 6


def test_per_prompt_sampling_params(llm):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 3, 6)]
    outputs = llm.generate([[1, 2], [3, 4], [5, 6]], params, use_tqdm=False)
    assert [len(o.token_ids) for o in outputs] == [1, 3, 6]


BAD = {
    "too long": ([1] * 40, "max_model_len=32"),
    "no room to generate": ([1] * 32, "leaves no room to generate within max_model_len=32"),
    "above vocab": ([1, 2, 512], "token id 512 at position 2 is outside the vocabulary [0, 512)"),
    "negative": ([-1, 4], "token id -1 at position 0 is outside the vocabulary"),
    "float token": ([1, 2.5], "element 1 is float"),
    "str token": ([1, "a"], "element 1 is str"),
    "bool token": ([True, 3], "element 0 is bool"),
    "empty ids": ([], "empty prompt"),
    "empty text": ("", "empty prompt"),
    "None": (None, "prompt must be a str or a list of int token ids, got NoneType"),
    "dict": ({"text": "hi"}, "got dict"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_prompt_is_rejected_while_the_others_complete(llm, case):
    prompt, message = BAD[case]
    good = [[3, 1, 4, 1, 5], [9, 2, 6]]
    outputs = llm.generate([good[0], prompt, good[1]], PARAMS, use_tqdm=False)
    bad = outputs[1]
    assert not bad.ok and message in bad.error
    assert bad.token_ids == [] and bad.finish_reason is None
    for out, prompt_ids in zip([outputs[0], outputs[2]], good):
        assert out.ok and out.prompt_token_ids == prompt_ids and len(out.token_ids) == 4
    assert not llm.scheduler.has_unfinished()


def test_all_prompts_bad_returns_only_errors(llm):
    outputs = llm.generate([[], [999]], PARAMS, use_tqdm=False)
    assert [o.ok for o in outputs] == [False, False]
    assert llm.last_run.steps == []


def test_bad_calls_raise(llm):
    with pytest.raises(ValueError, match="prompts is empty"):
        llm.generate([])
    with pytest.raises(TypeError, match="prompts must be"):
        llm.generate(7)
    with pytest.raises(ValueError, match="sampling_params has 1 entries for 2 prompts"):
        llm.generate([[1], [2]], [PARAMS])
    with pytest.raises(TypeError, match=r"sampling_params\[1\] must be a SamplingParams, got dict"):
        llm.generate([[1], [2]], [PARAMS, {"temperature": 0}])
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams"):
        llm.generate([[1]], {"temperature": 0})
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-0.5)  # invalid params never reach generate()


def test_bad_configuration_raises(tiny_qwen3_dir):
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_len'"):
        LLM(tiny_qwen3_dir, device="cpu", max_len=10)
    with pytest.raises(ValueError, match="CacheConfig.block_size"):
        LLM(tiny_qwen3_dir, device="cpu", block_size=0)
    with pytest.raises(ValueError, match="EngineConfig.dtype"):
        LLM(tiny_qwen3_dir, device="cpu", dtype="fp8")
    with pytest.raises(ValueError, match="max_position_embeddings=2048"):
        LLM(tiny_qwen3_dir, device="cpu", max_model_len=4096)


def test_max_model_len_defaults_to_the_model_limit(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, device="cpu", num_blocks=16, block_size=256)
    assert llm.scheduler_config.max_model_len == 2048  # the checkpoint's max_position_embeddings


def test_throughput_meter_splits_prefill_and_decode_time():
    meter = ThroughputMeter()
    meter.add(StepStats(0, "prefill", 2, 100, 0, 0, 2, 0, 0, 0), 0.5)
    meter.add(StepStats(1, "decode", 2, 0, 2, 0, 2, 0, 0, 0), 0.01)
    meter.add(StepStats(2, "mixed", 3, 50, 2, 0, 3, 0, 0, 0), 0.49)  # counts toward both
    assert meter.prefill_tokens_per_s == pytest.approx(150 / 0.99)
    assert meter.decode_tokens_per_s == pytest.approx(4 / 0.5)
    assert "prefill 152 tok/s, decode 8 tok/s" == meter.describe()
