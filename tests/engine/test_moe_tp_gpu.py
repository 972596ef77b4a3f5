"""Mixture-of-experts Qwen3 at TP=2 against TP=1 on two GPUs (NCCL): the tiny MoE preset (one
dense layer, two layers of 8 experts, top-2), each expert's intermediate dimension sharded over
the ranks and the fused MoE kernel on each.

float32: greedy tokens identical. bfloat16: teacher forced, as tests/engine/test_tp_gpu.py checks
the dense model: at every position of TP=1's greedy output, TP=2's next token must sit within bf16
rounding of TP=1's largest logit (the all-reduce rounds each rank's partial sum)."""

from __future__ import annotations

import numpy as np
import pytest

from engine import SamplingParams
from engine.core.model_shapes import TOKENIZER_VOCAB_SIZE
from tests.engine.tp_gpu_checks import TP1_ROUNDING, generate, teacher_forced, two_gpus

pytestmark = [pytest.mark.gpu, two_gpus]

NUM_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
ENGINE = dict(max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=4096, gpu_memory_utilization=0.3)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, TOKENIZER_VOCAB_SIZE, int(rng.integers(8, 300))).tolist() for _ in range(n)]


def _checkpoint(tmp_path_factory, dtype: str) -> str:
    from engine.checkpoint import write_checkpoint

    return str(write_checkpoint("tiny-qwen3-moe", tmp_path_factory.mktemp(f"moe-{dtype}"), dtype=dtype))


def test_moe_tp2_equals_tp1_float32(tmp_path_factory):
    model_dir = _checkpoint(tmp_path_factory, "float32")
    prompts = _prompts(8)
    want = generate(model_dir, prompts, GREEDY, ENGINE, tensor_parallel_size=1)
    assert generate(model_dir, prompts, GREEDY, ENGINE, tensor_parallel_size=2) == want


def test_moe_tp2_matches_tp1_bfloat16_teacher_forced(tmp_path_factory):
    model_dir = _checkpoint(tmp_path_factory, "bfloat16")
    _, gaps, _, _ = teacher_forced(model_dir, _prompts(8, seed=1), GREEDY, NUM_TOKENS, ENGINE)
    assert len(gaps) == 8 * NUM_TOKENS
    assert max(gaps) <= TP1_ROUNDING, max(gaps)
