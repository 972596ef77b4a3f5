"""The contract between the core and a backend: what callers may ask of an executor, typed.

A caller asks info() once for what it needs to know (cache geometry, vocabulary, EOS ids,
whether steps overlap, the CUDA graphs it replays) and never probes the executor for more.
Steps go in as StepPlans (engine.core.plan) through execute() or, overlapped, submit(); whoever
wants to watch them (the harness's recorder, a profiler) registers a StepHook with observe(), and
calls what observe() returned once done watching: an executor shared by several runs would
otherwise call every earlier run's hooks on each later step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from engine.core.graph_sizes import GraphSizes
from engine.core.plan import KVCacheSpec, StepPlan, StepResult


@dataclass(frozen=True)
class BackendInfo:
    """What a backend is, asked once after it is built.

    eos_token_ids: primary first (the scheduler stops on it); empty when the model has none.
    overlaps_steps: the loop submits step N+1 before reading step N's tokens (submit()).
    graph_sizes: the steps the backend replays as CUDA graphs (empty: every step eager).
    device: what runs the steps, for reports ("NVIDIA H100 80GB HBM3", "cpu", "simulated H100").
    all_reduce: how the tensor-parallel ranks sum partial outputs, as set up (engine.core.collectives):
        "nccl" or "symmetric" ("auto" resolved: it falls back to NCCL where the one-shot kernel
        cannot run); "" with one rank.
    """

    num_blocks: int
    block_size: int
    vocab_size: int
    eos_token_ids: tuple[int, ...] = ()
    overlaps_steps: bool = False
    graph_sizes: GraphSizes = GraphSizes()
    device: str = ""
    all_reduce: str = ""

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return KVCacheSpec(self.num_blocks, self.block_size)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None


class PendingStep(Protocol):
    def result(self) -> StepResult:
        """Wait for the step and return its tokens (once)."""


class EarlyTokens(Protocol):
    """A PendingStep that can be read before its result is taken (the engine's, engine.overlap)."""

    def sampled(self) -> list[int]:
        """Wait for the step's sampled tokens, one per plan entry (-1 where it samples none), and
        return them without taking the result (which result() still returns, once). Another
        thread may call it while the loop submits the next step (harness.serve.handoff)."""


@dataclass(frozen=True, slots=True)
class StepTiming:
    """When the caller's execute() or submit() call ran, on time.perf_counter()'s clock.
    overlapped: the step came through submit(), so returned_s is when it was queued."""

    called_s: float
    returned_s: float
    overlapped: bool


class StepHook(Protocol):
    def __call__(self, plan: StepPlan, result: StepResult, timing: StepTiming) -> None:
        """Called once per step, in step order, when its result is known: as execute() returns,
        or as the PendingStep of submit() hands its result over."""


# what observe() returns: call it to stop the hook (later calls do nothing)
Unobserve = Callable[[], None]


class Executor(Protocol):
    """execute() runs a step to completion. submit() returns once the step is queued; when
    info().overlaps_steps the loop then plans the next step while this one runs, and the next
    plan's decode entries may carry engine.core.async_scheduler.PLACEHOLDER for the token this
    step samples. A backend that cannot overlap runs the step in submit() and returns it done."""

    def info(self) -> BackendInfo: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def submit(self, plan: StepPlan) -> PendingStep: ...

    def observe(self, hook: StepHook) -> Unobserve: ...

    def hold_device(self, seconds: float) -> bool:
        """Keep the device busy for about `seconds` before the next step (True), or do nothing
        and return False where no device queue exists. A profiler times a step's device work
        alone by queueing it behind such a hold."""

    def shutdown(self) -> None: ...


class CompletedStep:
    """A PendingStep whose result is already known."""

    __slots__ = ("_result",)

    def __init__(self, result: StepResult) -> None:
        self._result = result

    def result(self) -> StepResult:
        return self._result

    def sampled(self) -> list[int]:
        return self._result.token_ids


class StepHooks:
    """An executor's observers: backends keep one, pass observe() to add() and run their steps
    through executed() and submitted(), which time the call only when someone is watching."""

    def __init__(self) -> None:
        self._hooks: list[StepHook] = []

    def add(self, hook: StepHook) -> Unobserve:
        hooks = self._hooks
        hooks.append(hook)

        def remove() -> None:
            if hook in hooks:
                hooks.remove(hook)

        return remove

    @property
    def watched(self) -> bool:
        return bool(self._hooks)

    def executed(self, plan: StepPlan, execute: Callable[[StepPlan], StepResult]) -> StepResult:
        if not self._hooks:
            return execute(plan)
        called = time.perf_counter()
        result = execute(plan)
        timing = StepTiming(called, time.perf_counter(), overlapped=False)
        for hook in self._hooks:
            hook(plan, result, timing)
        return result

    def submitted(self, plan: StepPlan, submit: Callable[[StepPlan], PendingStep]) -> PendingStep:
        if not self._hooks:
            return submit(plan)
        called = time.perf_counter()
        pending = submit(plan)
        return _ObservedStep(pending, plan, StepTiming(called, time.perf_counter(), overlapped=True), self._hooks)


class _ObservedStep:
    __slots__ = ("_pending", "_plan", "_timing", "_hooks")

    def __init__(self, pending: PendingStep, plan: StepPlan, timing: StepTiming, hooks: list[StepHook]) -> None:
        self._pending = pending
        self._plan: StepPlan | None = plan
        self._timing = timing
        self._hooks = hooks

    def result(self) -> StepResult:
        result = self._pending.result()
        plan = self._plan
        assert plan is not None, "a step's result is taken once"
        for hook in self._hooks:
            hook(plan, result, self._timing)
        self._plan = None  # the plan's entries need not outlive the step
        return result

    @property
    def host_s(self) -> float:
        """The watched step's host time of its submit(), where it has one (a simulated step's: the
        loop plans by it, engine.core.loop.Replica.plan_time; watching must not change that)."""
        return getattr(self._pending, "host_s", 0.0)

    def sampled(self) -> list[int]:
        """The watched step's EarlyTokens.sampled() (AttributeError where it has none)."""
        return cast(EarlyTokens, self._pending).sampled()
