"""An fp8 KV cache (CacheConfig.kv_cache_dtype="fp8") on CPU: the torch backend stores K/V as
float8 e4m3, saturated, and reads them back upcast; the engine sizes blocks by the narrower
element; logits stay close to Hugging Face's float32 forward but are not the float32 cache's."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.torch_backend import store_kv
from engine.core.config import CacheConfig
from engine.core.plan import ScheduledRequest, StepPlan, StepStats

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPT = [(28 + 3 * j) % 500 + 1 for j in range(40)]
FP8 = torch.float8_e4m3fn


def test_store_saturates_at_the_fp8_range_and_skips_padding():
    k_cache = torch.zeros(2, 4, 1, 3, dtype=FP8)
    v_cache = torch.zeros_like(k_cache)
    k = torch.tensor([[[1000.0, -1000.0, 0.3]], [[7.0, 7.0, 7.0]]])
    v = torch.tensor([[[-5e4, 2.0, 1e-3]], [[9.0, 9.0, 9.0]]])
    store_kv(k, v, k_cache, v_cache, torch.tensor([5, -1]))
    stored_k = k_cache.float().view(-1, 3)
    stored_v = v_cache.float().view(-1, 3)
    assert stored_k[5].tolist() == [448.0, -448.0, pytest.approx(0.3, rel=2**-4)]
    assert stored_v[5, 0].item() == -448.0 and stored_v[5, 1].item() == 2.0
    assert not torch.isnan(stored_k).any() and not torch.isnan(stored_v).any()
    # the padded token (slot -1) wrote nothing: every other slot is still zero
    assert stored_k[torch.arange(8) != 5].abs().sum() == 0


def _prefill_logits(model_dir, kv_cache_dtype: str) -> tuple[torch.Tensor, object]:
    llm = LLM(model_dir, device="cpu", block_size=4, num_blocks=64, max_model_len=64, kv_cache_dtype=kv_cache_dtype)
    runner = llm.executor.runner
    entry = ScheduledRequest("0", PROMPT, 0, list(range(10, 0, -1)), True, GREEDY, 0, False)
    plan = StepPlan([entry], StepStats(0, "mixed", 1, 0, 0, 0, 0, 0, 0, 0))
    with torch.inference_mode():
        logits = runner.model.compute_logits(runner.forward(runner.prepare(plan)))
    return logits, runner


def test_fp8_cache_logits_stay_near_hf_and_differ_from_the_float32_cache(tiny_qwen3_dir):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference(torch.tensor([PROMPT])).logits[0]
    full, full_runner = _prefill_logits(tiny_qwen3_dir, "auto")
    narrow, narrow_runner = _prefill_logits(tiny_qwen3_dir, "fp8")
    assert full_runner.kv_cache.dtype == torch.float32 and narrow_runner.kv_cache.dtype == FP8
    assert narrow_runner.block_bytes * 4 == full_runner.block_bytes
    scale = expected.abs().max()
    assert (full - expected).abs().max() / scale < 1e-5
    error = (narrow - expected).abs().max() / scale
    # e4m3 keeps 3 mantissa bits: K/V carry up to 6% rounding, the logits a few percent at most,
    # and never none (which would mean the cache was not fp8 after all)
    assert 1e-4 < error < 5e-2
    assert torch.equal(narrow.argmax(1), expected.argmax(1))


def test_fp8_cache_serves_generate_with_preemption(tiny_qwen3_dir):
    prompts = [PROMPT[: 5 + 7 * i] for i in range(5)]
    llm = LLM(tiny_qwen3_dir, device="cpu", block_size=4, num_blocks=24, max_num_seqs=4, max_model_len=64,
              kv_cache_dtype="fp8")
    try:
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    finally:
        llm.shutdown()
    assert [len(o.token_ids) for o in outputs] == [12] * 5
    assert all(o.error is None for o in outputs)
    assert sum(o.num_preemptions for o in outputs) > 0  # recomputed prefills rewrite fp8 blocks


@pytest.mark.parametrize("bad", ["fp16", "float8", "", None])
def test_unknown_kv_cache_dtype_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype=bad)
