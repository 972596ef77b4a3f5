"""The set-up the two-GPU tensor- and expert-parallel tests share (test_tp_gpu, test_moe_tp_gpu,
test_moe_ep_gpu, test_disagg_gpu): engines started and shut down around one generate, TP=1's
float32 logits at each generated position, and the teacher-forced check. bf16 TP=2 may part from
TP=1 at a near-tie, so TP=2 predicts the next token after every prefix of TP=1's own greedy
output, and each such token must sit within bf16 rounding of TP=1's largest logit
(TP1_ROUNDING of the row's largest magnitude)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.plan import ScheduledRequest, StepPlan, StepStats

two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")

# bf16 keeps 8 significant bits (2^-8 relative); the sum of two ranks' rounded partials and the
# rounded LM-head input allow a few of those
TP1_ROUNDING = 2.0**-6
ONE_GREEDY_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)


def generate(model_dir: str, prompts: list[list[int]], params, engine: dict, **kw) -> list[list[int]]:
    """Each prompt's output tokens from one engine LLM(model_dir, **engine, **kw), shut down after."""
    llm = LLM(model_dir, **engine, **kw)
    try:
        return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.shutdown()


def tp1_logits(llm, sequences, prompt_lens) -> list[torch.Tensor]:
    """TP=1's float32 logits [generated positions, vocab] of each sequence, on the CPU."""
    runner = llm.executor.runner
    out = []
    with torch.inference_mode():
        for seq, plen in zip(sequences, prompt_lens):
            table = list(range(-(-len(seq) // runner.block_size)))
            entry = ScheduledRequest("m", seq, 0, table, True, SamplingParams(temperature=0.0), 0, False)
            plan = StepPlan([entry], StepStats(0, "prefill", 1, len(seq), 0, 0, 0, 0, 0, 0))
            out.append(runner.model.compute_logits(runner.forward(runner.prepare(plan)))[plen - 1: len(seq) - 1].cpu())
    return out


def gaps(logits: torch.Tensor, tokens: list[int]) -> tuple[list[float], list[float]]:
    """Per position: TP=1's largest logit minus its logit of `tokens`, relative to the row's largest
    magnitude, and the top-2 margin in standard deviations."""
    top2 = logits.topk(2, dim=-1).values
    chosen = logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]
    gap = (top2[:, 0] - chosen) / logits.abs().max(dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]) / logits.std(dim=-1)
    return gap.tolist(), margin.tolist()


def teacher_forced(model_dir: str, prompts: list[list[int]], greedy: SamplingParams, num_tokens: int,
                   engine: dict, **tp2) -> tuple[list[list[int]], list[float], list[float], list[int]]:
    """TP=1's greedy outputs (greedy: num_tokens each, ignore_eos), then TP=2's (LLM keywords tp2)
    greedy token after each of their first num_tokens prefixes; returns TP=1's outputs, each
    position's gap and margin (gaps()), and TP=2's tokens, position by position."""
    llm1 = LLM(model_dir, tensor_parallel_size=1, **engine)
    try:
        want = [o.token_ids for o in llm1.generate(prompts, greedy, use_tqdm=False)]
        logits = tp1_logits(llm1, [p + w for p, w in zip(prompts, want)], [len(p) for p in prompts])
    finally:
        llm1.shutdown()
    prefixes = [p + w[:j] for p, w in zip(prompts, want) for j in range(num_tokens)]
    forced = [t[0] for t in generate(model_dir, prefixes, ONE_GREEDY_TOKEN, engine, tensor_parallel_size=2, **tp2)]
    all_gaps: list[float] = []
    margins: list[float] = []
    for i, row in enumerate(logits):
        g, m = gaps(row, forced[i * num_tokens:(i + 1) * num_tokens])
        all_gaps += g
        margins += m
    return want, all_gaps, margins, forced


def report(name: str, payload: dict) -> None:
    """Print the payload, and write it to $TP_REPORT_DIR/<name>.json where that is set."""
    print(name, json.dumps(payload))
    out = os.environ.get("TP_REPORT_DIR")
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(payload, f, indent=1)
