"""The engine against Hugging Face transformers on a tiny Qwen3 checkpoint, in float32 on CPU.

Logits of a prefill (and of a decode step over the paged cache) through the runner match HF's
forward to 1e-4 relative; greedy LLM.generate matches HF's generate token for token, also when
prompts are chunk-prefilled, hit the prefix cache, or are preempted, under both policies.

NOTE: the checkpoint's random weights (std 0.02) make a near-uniform model whose greedy output
repeats one token forever, which would let a broken engine pass. The fixture scales every
non-norm weight by 20, so that greedy continuations wander over the vocabulary.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import LLM, SamplingParams
from engine.core.plan import ScheduledRequest, StepPlan, StepStats

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j) % 500 + 1 for j in range(n)] for i, n in enumerate([5, 21, 12, 1, 30, 9])]
SHARED = [(11 * j) % 490 + 2 for j in range(26)]  # a long common prefix for the prefix-cache case
PREFIX_PROMPTS = [SHARED + [400 + i, 13 * i % 97 + 1][: 1 + i % 2] for i in range(5)]


@pytest.fixture(scope="module")
def model_dir(tiny_qwen3_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sharp-qwen3")
    shutil.copytree(tiny_qwen3_dir, out, dirs_exist_ok=True)
    for path in out.glob("*.safetensors"):
        weights = load_file(path)
        save_file({k: v if "norm" in k else (v * 20).contiguous() for k, v in weights.items()}, path,
                  metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def hf_greedy(model_dir):
    """prompt -> HF's greedy continuation; eos=None ignores end-of-sequence, as ignore_eos does."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cache: dict = {}

    def generate(prompt: list[int], max_new_tokens: int = 16, eos=None) -> list[int]:
        key = (tuple(prompt), max_new_tokens, eos)
        if key not in cache:
            ids = torch.tensor([prompt])
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                 attention_mask=torch.ones_like(ids))
            cache[key] = out[0, len(prompt):].tolist()
        return cache[key]

    generate.model = model
    return generate


def _relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def test_runner_logits_match_hf_forward_for_prefill_and_decode(model_dir, hf_greedy):
    llm = LLM(model_dir, device="cpu", block_size=4, num_blocks=64, max_model_len=64)
    runner = llm.executor.runner
    prompts = [PROMPTS[1], PROMPTS[0], PROMPTS[4]]
    tables = [list(range(16 * i + 15, 16 * i - 1, -1)) for i in range(3)]  # scattered, descending blocks

    def step(entries):
        return StepPlan(entries, StepStats(0, "mixed", len(entries), 0, 0, 0, 0, 0, 0, 0))

    # prefill, logits at every position
    entries = [ScheduledRequest(str(i), p, 0, t, True, GREEDY, 0, False)
               for i, (p, t) in enumerate(zip(prompts, tables))]
    with torch.inference_mode():
        inputs = runner.prepare(step(entries))
        logits = runner.model.compute_logits(runner.forward(inputs))  # [num_tokens, vocab]
        start = 0
        for p in prompts:
            reference = hf_greedy.model(torch.tensor([p])).logits[0]
            assert _relative_error(logits[start:start + len(p)], reference) < 1e-4
            start += len(p)
    # one decode step over the paged cache; only sampling rows get logits
    next_tokens = [int(hf_greedy.model(torch.tensor([p])).logits[0, -1].argmax()) for p in prompts]
    decodes = [ScheduledRequest(str(i), [tok], len(p), t, i != 1, GREEDY, 1, True)
               for i, (p, t, tok) in enumerate(zip(prompts, tables, next_tokens))]
    seen = []
    compute_logits = runner.model.compute_logits
    runner.model.compute_logits = lambda hidden, **kw: seen.append(hidden.shape[0]) or compute_logits(hidden, **kw)
    try:
        tokens = runner.execute(step(decodes))
    finally:
        runner.model.compute_logits = compute_logits
    assert seen == [2] and tokens[1] == -1
    for i in (0, 2):
        with torch.inference_mode():
            reference = hf_greedy.model(torch.tensor([prompts[i] + [next_tokens[i]]])).logits[0, -1]
        assert tokens[i] == int(reference.argmax())


SCENARIOS = {
    "plain": dict(block_size=16),
    "chunked": dict(block_size=4, max_num_batched_tokens=8, max_num_seqs=4),
    "prefix": dict(block_size=4, max_num_seqs=2),
    "preempt": dict(block_size=4, num_blocks=14, max_num_seqs=4),
}


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("policy", ["nano", "mixed"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_greedy_generate_matches_hf(model_dir, hf_greedy, policy, scenario, async_scheduling):
    llm = LLM(model_dir, device="cpu", policy=policy, max_model_len=64, async_scheduling=async_scheduling,
              **SCENARIOS[scenario])
    assert llm.executor.info().overlaps_steps is async_scheduling
    prompts = PREFIX_PROMPTS if scenario == "prefix" else PROMPTS
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [hf_greedy(p) for p in prompts]
    assert all(o.finish_reason == "length" for o in outputs)
    steps = llm.last_run.steps
    # the mechanism under test really happened
    if scenario == "chunked":
        assert max(len(p) for p in prompts) > 8
        assert all(s.stats.num_prefill_tokens + s.stats.num_decode_tokens <= 8 for s in steps)
    elif scenario == "prefix":
        assert llm.scheduler.block_manager.hits > 0
        assert sum(o.num_cached_tokens for o in outputs) >= 4 * (len(SHARED) // 4) * 3
    elif scenario == "preempt":
        assert llm.scheduler.num_preemptions > 0
        assert sum(o.num_preemptions for o in outputs) == llm.scheduler.num_preemptions


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_stop_token_ends_the_request_like_hf_eos(model_dir, hf_greedy, async_scheduling):
    prompt = PROMPTS[2]
    stop = hf_greedy(prompt)[5]  # a token the model produces on its own
    expected = hf_greedy(prompt, eos=stop)
    assert expected[-1] == stop and len(expected) <= 6
    llm = LLM(model_dir, device="cpu", max_model_len=64, block_size=8, async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop_token_ids=(stop,))
    out = llm.generate([prompt, PROMPTS[0]], [params, GREEDY], use_tqdm=False)
    assert out[0].token_ids == expected and out[0].finish_reason == "stop"
    assert out[1].token_ids == hf_greedy(PROMPTS[0])


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_checkpoint_eos_handling_matches_hf(model_dir, hf_greedy, async_scheduling):
    # HF stops on any id in generation_config.eos_token_id; LLM.generate must do the same.
    llm = LLM(model_dir, device="cpu", max_model_len=64, block_size=8, async_scheduling=async_scheduling)
    eos = list(llm.executor.info().eos_token_ids)
    assert len(eos) == 2
    params = SamplingParams(temperature=0.0, max_tokens=32)
    for out, prompt in zip(llm.generate(PROMPTS, params, use_tqdm=False), PROMPTS):
        assert out.token_ids == hf_greedy(prompt, 32, eos=tuple(eos))
        ended = out.token_ids[-1] in eos
        assert out.finish_reason == ("stop" if ended else "length") and out.stop_reason is None


def test_seeded_sampling_is_reproducible_and_batch_independent(model_dir):
    llm = LLM(model_dir, device="cpu", max_model_len=64, block_size=8, seed=1)
    mine = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=42, ignore_eos=True)
    other = SamplingParams(temperature=0.8, max_tokens=5, ignore_eos=True)
    alone = llm.generate([PROMPTS[2]], mine, use_tqdm=False)[0].token_ids
    crowded = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[4]], [other, mine, other], use_tqdm=False)[1]
    other_engine = LLM(model_dir, device="cpu", max_model_len=64, block_size=4, seed=9)
    again = other_engine.generate(PROMPTS[2], mine, use_tqdm=False)[0]
    assert crowded.token_ids == alone == again.token_ids
    different = llm.generate([PROMPTS[2]], SamplingParams(temperature=1.0, top_p=0.95, max_tokens=12, seed=43,
                                                          ignore_eos=True), use_tqdm=False)[0]
    assert different.token_ids != alone


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_greedy_matches_hf(model_dir, hf_greedy):
    llm = LLM(model_dir, device="cuda", dtype="float32", attention_backend="torch", max_model_len=64,
              block_size=4, max_num_batched_tokens=8, max_num_seqs=4, policy="mixed")
    try:
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.token_ids for o in outputs] == [hf_greedy(p) for p in PROMPTS]


def test_overlapped_steps_sample_the_same_seeded_tokens(model_dir):
    # the sampler keys a seeded draw by the token's index; placeholders must not shift it
    params = [SamplingParams(temperature=1.0, top_k=50, max_tokens=10, seed=s, ignore_eos=True) for s in range(6)]
    plain = LLM(model_dir, device="cpu", max_model_len=64, block_size=4, num_blocks=14, async_scheduling=False)
    overlapped = LLM(model_dir, device="cpu", max_model_len=64, block_size=4, num_blocks=14, async_scheduling=True)
    expected = [o.token_ids for o in plain.generate(PROMPTS, params, use_tqdm=False)]
    assert [o.token_ids for o in overlapped.generate(PROMPTS, params, use_tqdm=False)] == expected
    assert overlapped.scheduler.num_preemptions > 0
