"""Every dtype EngineConfig accepts runs on the GPU, through start-up (warm-up and graph capture at
the largest sizes) and prompts long enough to select the prefill kernel's largest tile, and its
tokens are the reference model's by teacher forcing (random weights give near-flat logits, so a
free-running comparison would flip on rounding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import make_metadata, slot_mapping_for
from engine.loader import load_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# the prefill kernel takes its largest tile from kernels.prefill_tiles.LONG_QUERY tokens on
PROMPT_LENS = (4500, 700, 17)
NEW_TOKENS = 4
# a generated token's reference logit may sit this far (relative to the logit scale) below the
# reference's largest: the kernels' and the reference's rounding differ
TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    from engine.checkpoint import write_checkpoint

    return write_checkpoint("qwen3-0.6b", tmp_path_factory.mktemp("qwen3-0.6b"), dtype="bfloat16")


def _reference_logits(model, ids: list[int], block_size: int = 256,
                      kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Float32 logits of every position, the torch attention backend over the whole sequence."""
    caches = model.make_kv_caches(-(-len(ids) // block_size), block_size, kv_dtype)
    table = list(range(len(caches[0][0])))
    meta = make_metadata([len(ids)], [len(ids)], [table], slot_mapping_for(table, 0, len(ids), block_size), "cuda")
    with torch.inference_mode():
        hidden = model(torch.tensor(ids, device="cuda"), torch.arange(len(ids), device="cuda"), caches, meta)
        return model.compute_logits(hidden).float()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_dtype_serves_long_prompts_on_cuda(qwen3_dir, dtype):
    rng = np.random.default_rng(len(dtype))
    prompts = [rng.integers(0, 10_000, n).tolist() for n in PROMPT_LENS]
    llm = LLM(str(qwen3_dir), dtype=dtype, max_model_len=8192)
    try:
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    finally:
        llm.shutdown()
    _check_teacher_forced(qwen3_dir, dtype, prompts, outputs)


def _check_teacher_forced(qwen3_dir, dtype: str, prompts, outputs, kv_dtype: torch.dtype | None = None) -> None:
    """Each generated token's reference logit lies within TOLERANCE of the reference's largest."""
    reference, _ = load_model(qwen3_dir, dtype=dtype, device="cuda", attention_backend="torch")
    for prompt, out in zip(prompts, outputs):
        assert out.error is None and len(out.token_ids) == NEW_TOKENS
        logits = _reference_logits(reference, prompt + out.token_ids[:-1], kv_dtype=kv_dtype)[len(prompt) - 1:]
        scale = float(logits.abs().max())
        chosen = logits.gather(1, torch.tensor(out.token_ids, device="cuda")[:, None])[:, 0]
        gap = (logits.max(dim=1).values - chosen) / scale
        assert (gap <= TOLERANCE[dtype]).all(), (dtype, kv_dtype, len(prompt), gap.tolist())


def test_an_fp8_kv_cache_serves_long_prompts_on_cuda(qwen3_dir):
    """The Triton kernels over an fp8 cache, in CUDA graphs, against the torch backend reading an
    fp8 cache of its own: the same quantisation, so the bf16 tolerance holds."""
    rng = np.random.default_rng(8)
    prompts = [rng.integers(0, 10_000, n).tolist() for n in PROMPT_LENS]
    llm = LLM(str(qwen3_dir), dtype="bfloat16", max_model_len=8192, kv_cache_dtype="fp8")
    try:
        assert llm.executor.runner.kv_cache.dtype == torch.float8_e4m3fn
        outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    finally:
        llm.shutdown()
    _check_teacher_forced(qwen3_dir, "bfloat16", prompts, outputs, torch.float8_e4m3fn)
