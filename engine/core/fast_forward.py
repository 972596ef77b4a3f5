"""Fast-forward: runs of decode steps booked at once instead of planned one by one.

Between events (an arrival, a preemption, a prefill chunk) a replica plans the same decode batch
step after step; only each request's context grows by one token a step, and when a request
samples its last token it leaves the batch. Once a step like that has run (plain) or been
submitted (overlapped), the loop hands it here as the template and this module books the steps
that follow it, through finishes, up to the next event, with the effects the step-by-step path
would have, in the same order:

- the block manager gets the same allocations (per step, in running order), prefix-cache
  registrations (per step, in batch order, after the step's allocations) and frees (a finished
  request's, in batch order; overlapped steps free a request's blocks when its last step is
  planned, engine.core.async_scheduler);
- each request its sampled tokens (DecodeRunner.sample_runs, the tokens the backend samples) and
  counters; a request that finishes gets its finish time and is recorded, as update() does;
- the clock the same durations, added one at a time (a cumulative sum is that sum, bit for bit);
- the steps are kept as StepRuns (engine.core.step_log): one per batch, not a record per step.

The work is a few operations per stretch of steps with one batch (a "segment",
engine.core.fast_forward_steps) plus a call per block the steps need or fill, not a call per step.
A run waits, open, at the replica's horizon (the next arrival; a fleet's next routing) and goes on
at the replica's next tick, the prefills of what arrived planned and run between its steps
(engine.core.fast_forward_run says when it closes instead). requests, steps and clock end exactly
as the step-by-step path leaves them; tests/sim/test_fast_forward.py checks that.

A run does not start where a request could stop on a token (stop_token_ids, or an EOS the backend
can sample), where the policy would not plan the same batch again (Policy.repeats_decode) or where
step hooks watch the executor (they would miss the steps booked here; DecodeRunner.fast_forwards).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.core.fast_forward_run import FastRun
from engine.core.plan import StepPlan, StepResult
from engine.core.request import TokenIds

if TYPE_CHECKING:
    from engine.core.executor import PendingStep
    from engine.core.loop import Replica
    from engine.core.request import Request


@runtime_checkable
class DecodeRunner(Protocol):
    """An executor that can price and sample repeats of a decode step without a plan for each."""

    def fast_forwards(self) -> bool:
        """Whether runs may be booked now (False: switched off, or hooks watch the steps)."""

    def decode_run_prices(self, plan: StepPlan, first: int, count: int) -> list[float] | None:
        """Durations of repeats first .. first + count - 1 of plan's decode batch (repeat j: each
        request's context j tokens longer), what execute()/submit() would price them at, in any
        number at once (a cost model without state); None where the steps must be priced one at
        a time (decode_prices)."""

    def decode_prices(self, plan: StepPlan) -> Iterator[float]:
        """The durations of plan's repeats, the first repeat first, each priced as it is taken."""

    def sample_runs(self, runs: Sequence[tuple[str, int, int]]) -> list[TokenIds]:
        """For each (request_id, first_position, count), the tokens the request samples at those
        positions, never the executor's info().eos_token_id."""

    def resubmitted(self, pending: PendingStep, result: StepResult) -> PendingStep:
        """Overlapped steps: the step in flight (pending, unread) replaced by one that priced to result."""


def fast_forward(replica: Replica, plan: StepPlan, runner: DecodeRunner) -> FastRun | None:
    """Start a run after plan, the decode step the replica just ran (plain) or submitted
    (overlapped), and book it up to the horizon; returns it if it waits there, open (the replica
    resumes it at its next tick), None if it closed or never started."""
    scheduler = replica.scheduler
    running = scheduler.running
    if len(plan.scheduled) != len(running) or plan.preempted_ids or not scheduler.policy.repeats_decode(scheduler):
        return None
    if replica.clock.now() >= replica.horizon() or not runner.fast_forwards():
        return None
    unsampled = replica.executor.info().eos_token_id
    if not bookable(running, plan, scheduler.eos_token_id, unsampled):
        return None
    run = FastRun(replica, plan, runner, unsampled)
    return run if run.advance() else None


def bookable(running: list[Request], plan: StepPlan, eos: int | None, unsampled: int | None) -> bool:
    """Whether the template's batch can be booked: none of its requests could stop on a token."""
    eos_stops = eos is not None and eos != unsampled
    for request, entry in zip(running, plan.scheduled):
        params = request.sampling_params
        if entry.request_id != request.request_id or params.stop_token_ids or (eos_stops and not params.ignore_eos):
            return False
    return True
