"""A replica's resources for sizing a fleet on the demand (engine.core.elastic_limits.ReplicaLimits):
its sequence slots, its KV cache in tokens, and the tokens per second its steps compute at its full
token budget, priced by the simulator's own step model.

A replica bound by its prompt tokens fills every step's budget (max_num_batched_tokens) with
prefill chunks and the decodes of the requests it holds; the tokens per second of such steps, over
the prompt and output tokens a request brings, is the request rate it serves. The steps priced are
the scheduler's: prompts of the mean length laid end to end and cut at the budget (at most
max_num_seqs of them a step), each chunk attending to the context before it, so a long prompt's
later chunks cost what they cost in the run. The pricing uses a cost model of its own, so the run's
(its launch state, its host-jitter draws) is untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from engine.core.config import SchedulerConfig
from engine.core.elastic_limits import ReplicaLimits
from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams

StepTime = Callable[[StepPlan], float]
BUCKET_TOKENS = 16  # prompt lengths are priced to this many tokens: one pricing serves nearby means


class PromptPricer:
    """tokens_per_s(mean prompt tokens): full-budget steps of prompts of that length, priced once a bucket."""

    def __init__(self, step_time: StepTime, scheduler: SchedulerConfig, block_size: int) -> None:
        self.step_time = step_time
        self.budget = scheduler.max_num_batched_tokens
        self.max_seqs = scheduler.max_num_seqs
        self.block_size = block_size
        self.priced: dict[int, float] = {}

    def __call__(self, prompt_tokens: float) -> float:
        if not prompt_tokens > 0:
            raise ValueError(f"prompt_tokens must be > 0, got {prompt_tokens}")
        bucket = max(1, round(prompt_tokens / BUCKET_TOKENS)) * BUCKET_TOKENS
        if bucket not in self.priced:
            self.priced[bucket] = self._price(bucket)
        return self.priced[bucket]

    def _price(self, prompt: int) -> float:
        """Tokens per second of the full steps that cover at least two steps and one whole prompt."""
        steps = max(2, math.ceil(prompt / self.budget) + 1)
        tokens = seconds = 0.0
        done = 0  # tokens of the current prompt already computed
        for step in range(steps):
            entries: list[ScheduledRequest] = []
            room = self.budget
            while room > 0 and len(entries) < self.max_seqs:
                chunk = min(room, prompt - done)
                entries.append(self._entry(f"p{step}-{len(entries)}", done, chunk, done + chunk == prompt))
                room -= chunk
                done = 0 if done + chunk == prompt else done + chunk
            computed = self.budget - room
            stats = StepStats(step, "prefill", len(entries), computed, 0, 0, len(entries), 0, 0, 0)
            seconds += self.step_time(StepPlan(entries, stats))
            tokens += computed
        return tokens / seconds

    def _entry(self, request_id: str, computed: int, chunk: int, last: bool) -> ScheduledRequest:
        blocks = list(range(-(-(computed + chunk) // self.block_size)))
        return ScheduledRequest(request_id, [0] * chunk, computed, blocks, last, SamplingParams(), 0, False)


def replica_limits(step_time: StepTime, scheduler: SchedulerConfig, num_blocks: int, block_size: int) -> ReplicaLimits:
    """A replica's resources, its token rate priced by step_time (a cost model of its own)."""
    return ReplicaLimits(scheduler.max_num_seqs, num_blocks * block_size,
                         PromptPricer(step_time, scheduler, block_size))
