"""Fake executors for core tests: deterministic tokens, no model."""

from __future__ import annotations

import xxhash

from engine.core.executor import BackendInfo, CompletedStep, StepHook, StepHooks
from engine.core.plan import PLACEHOLDER, StepPlan, StepResult


def backend_info(num_blocks: int, block_size: int, eos_token_id: int | None = None,
                 overlaps_steps: bool = False, vocab_size: int = 1000) -> BackendInfo:
    """What a scheduler needs of a backend, for tests that drive the scheduler by hand."""
    eos = () if eos_token_id is None else (eos_token_id,)
    return BackendInfo(num_blocks, block_size, vocab_size, eos, overlaps_steps)


class FakeExecutor:
    """Samples token = hash(request id, position) % vocab; counts what it was asked to compute."""

    overlaps_steps = False

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int = 1000, eos_token_id: int | None = None,
                 eos_every: int = 0) -> None:
        self._info = backend_info(num_blocks, block_size, eos_token_id, self.overlaps_steps, vocab_size)
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.eos_every = eos_every
        self.plans: list[StepPlan] = []
        self.hooks = StepHooks()

    def info(self) -> BackendInfo:
        return self._info

    def execute(self, plan: StepPlan) -> StepResult:
        return self.hooks.executed(plan, self._compute)

    def _compute(self, plan: StepPlan) -> StepResult:
        self.plans.append(plan)
        tokens = []
        for entry in plan.scheduled:
            position = entry.context_len
            token = xxhash.xxh64_intdigest(f"{entry.request_id}:{position}".encode()) % self.vocab_size
            if self.eos_every and self.eos_token_id is not None and token % self.eos_every == 0:
                token = self.eos_token_id
            tokens.append(token)
        return StepResult(tokens, 1e-3 * (1 + plan.num_tokens / 1000))

    def submit(self, plan: StepPlan):
        return self.hooks.submitted(plan, lambda p: CompletedStep(self._compute(p)))

    def observe(self, hook: StepHook):
        return self.hooks.add(hook)

    def hold_device(self, seconds: float) -> bool:
        return False

    def shutdown(self) -> None:
        pass


class _Done:
    def __init__(self, result: StepResult) -> None:
        self._result = result
        self.taken = False

    def result(self) -> StepResult:
        assert not self.taken, "a pending step's result is read once"
        self.taken = True
        return self._result


class OverlappingFakeExecutor(FakeExecutor):
    """The fake behind the overlapped loop: submit() stands in for a device that samples a step's
    tokens while the host plans the next one. A placeholder input must be the token that the
    previous submitted step sampled at that very position; the fake substitutes it, as the
    engine does on the device, and fails loudly on any other placeholder."""

    overlaps_steps = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._sampled_last_step: dict[str, tuple[int, int]] = {}  # request id -> (position, token)
        self._pending: _Done | None = None

    def submit(self, plan: StepPlan):
        return self.hooks.submitted(plan, self._queue)

    def _queue(self, plan: StepPlan) -> _Done:
        assert self._pending is None or self._pending.taken or len(self.plans) >= 1
        for entry in plan.scheduled:
            for offset, token in enumerate(entry.token_ids):
                if token != PLACEHOLDER:
                    continue
                position = entry.num_computed_tokens + offset
                assert offset == len(entry.token_ids) - 1, "a placeholder is only ever an entry's last token"
                sampled = self._sampled_last_step.get(entry.request_id)
                assert sampled is not None and sampled[0] == position, (
                    f"placeholder of {entry.request_id} at {position} was not sampled by the previous step")
        result = self._compute(plan)
        self._sampled_last_step = {e.request_id: (e.context_len, t)
                                   for e, t in zip(plan.scheduled, result.token_ids) if e.sample}
        self._pending = _Done(result)
        return self._pending
