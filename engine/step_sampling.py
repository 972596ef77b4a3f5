"""A step's sampling: logits at the last token of each request that samples, one id per request.

Rows of plan.scheduled that do not sample (a prefill chunk short of the prompt's end) get -1.
"""

from __future__ import annotations

import torch

from engine.core.plan import StepPlan
from engine.sampler import Sampler


def step_logits(model: torch.nn.Module, hidden: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor:
    """hidden [token rows, hidden], logits_indices [num_sampled] -> [num_sampled, vocab]. Every
    tensor-parallel rank calls it: the LM head gathers across ranks."""
    return model.compute_logits(hidden[logits_indices], upcast=False)


def sample_step(sampler: Sampler, plan: StepPlan, sample_rows: list[int], logits: torch.Tensor) -> torch.Tensor:
    """Sampled ids on the device [num_sampled], one per entry of plan.scheduled in sample_rows."""
    entries = [plan.scheduled[i] for i in sample_rows]
    params = [e.sampling_params for e in entries]
    return sampler.sample(logits, params, [e.num_output_tokens for e in entries])


def tokens_per_entry(num_entries: int, sample_rows: list[int], sampled: list[int]) -> list[int]:
    """The sampled ids placed at their rows of plan.scheduled; -1 elsewhere."""
    tokens = [-1] * num_entries
    for row, token in zip(sample_rows, sampled):
        tokens[row] = token
    return tokens
