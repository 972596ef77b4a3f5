"""A fake executor for core tests: deterministic tokens, no model."""

from __future__ import annotations

import xxhash

from engine.core.plan import KVCacheSpec, StepPlan, StepResult


class FakeExecutor:
    """Samples token = hash(request id, position) % vocab; counts what it was asked to compute."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 1000, eos_token_id: int | None = None,
                 eos_every: int = 0) -> None:
        self.spec = KVCacheSpec(num_blocks, block_size)
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.eos_every = eos_every
        self.plans: list[StepPlan] = []

    def kv_cache_spec(self) -> KVCacheSpec:
        return self.spec

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        tokens = []
        for entry in plan.scheduled:
            position = entry.context_len
            token = xxhash.xxh64_intdigest(f"{entry.request_id}:{position}".encode()) % self.vocab_size
            if self.eos_every and self.eos_token_id is not None and token % self.eos_every == 0:
                token = self.eos_token_id
            tokens.append(token)
        return StepResult(tokens, 1e-3 * (1 + plan.num_tokens / 1000))

    def shutdown(self) -> None:
        pass
