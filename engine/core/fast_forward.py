"""Fast-forward: a run of identical decode steps booked at once instead of one by one.

Between events (an arrival, a finish, a preemption, a prefill chunk) a replica plans the same
decode batch step after step; only each request's context grows by one token a step. Once a
step like that has run, the loop asks the backend to price the next repeats of it (one float a
step, DecodeRunner.decode_prices) and books them here: the block manager gets the blocks and
prefix-cache registrations the step-by-step path would give, in the same order (per step: blocks
in running order, then full blocks offered to the cache in batch order), each request its tokens
(DecodeRunner.sample_tokens, the tokens the backend would sample), the clock the same durations
added one at a time, and the run a StepRecord per step (a replica that keeps only step totals:
the run added to them at once). So requests, steps and the clock end exactly as the step-by-step
path leaves them; tests/sim/test_fast_forward.py checks that (tests/harness/test_plan_speed.py
and test_workload_stream.py the totals).

A run stops before the step that would finish a request (the normal path plans it), before the
step that would need more blocks than are free (a preemption), and before any step that starts
at or after `horizon` (the next arrival; a fleet's next routing). It does not start where a
request could stop on a token (stop_token_ids, or an EOS the backend can sample), where the
policy might admit a waiting request (Policy.repeats_decode), or where step hooks watch the
executor (they would miss the steps booked here; DecodeRunner.decode_prices returns None).
With overlapped steps (AsyncScheduler) the step in flight stays in flight: the run ends with its
last step submitted, as the step-by-step path leaves it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.core.plan import PLACEHOLDER, ScheduledRequest, StepPlan, StepResult, StepStats

if TYPE_CHECKING:
    from engine.core.executor import PendingStep
    from engine.core.loop import Replica
    from engine.core.request import Request


@runtime_checkable
class DecodeRunner(Protocol):
    """An executor that can price and sample repeats of a decode step without a plan for each."""

    def decode_prices(self, plan: StepPlan) -> Iterator[float] | None:
        """Durations of the steps that repeat plan's decode batch, each request's context one
        token longer per step, the first repeat first: what execute()/submit() would price them
        at, in order. None: this executor cannot fast-forward now (disabled, or hooks watch it)."""

    def sample_tokens(self, request_id: str, first_position: int, count: int) -> list[int]:
        """The tokens the request samples at positions first_position .. + count - 1, never the
        executor's info().eos_token_id."""

    def sample_runs(self, runs: Sequence[tuple[str, int, int]]) -> list[list[int]]:
        """sample_tokens(*run) for each (request_id, first_position, count) run, in one call."""

    def resubmitted(self, pending: PendingStep, result: StepResult) -> PendingStep:
        """Overlapped steps: the step in flight (pending, unread) replaced by one that priced to result."""


def fast_forward(replica: Replica, plan: StepPlan, runner: DecodeRunner) -> int:
    """Book the repeats of plan, the decode step the replica just ran (plain) or submitted
    (overlapped), up to the next event; returns how many steps were booked."""
    scheduler = replica.scheduler
    running = scheduler.running
    entries = plan.scheduled
    if len(entries) != len(running) or plan.preempted_ids or not scheduler.policy.repeats_decode(scheduler):
        return 0
    steps = _steps_before_finish(running, entries, scheduler.eos_token_id, replica.executor.info().eos_token_id)
    if steps < 1 or replica.clock.now() >= replica.horizon():
        return 0
    prices = runner.decode_prices(plan)
    if prices is None:
        return 0
    return _FastRun(replica, plan, runner, prices, steps).book()


def _steps_before_finish(running: list[Request], entries: list[ScheduledRequest], eos: int | None,
                         unsampled: int | None) -> int:
    """Repeats before the first that finishes a request; 0 where a request could stop on a token."""
    steps = 1 << 62
    for request, entry in zip(running, entries):
        params = request.sampling_params
        if entry.request_id != request.request_id or params.stop_token_ids:
            return 0
        if eos is not None and eos != unsampled and not params.ignore_eos:
            return 0
        left = request.max_tokens - (len(request.token_ids) - request.num_prompt_tokens)  # type: ignore[operator]
        if left - 1 < steps:
            steps = left - 1
    return steps


class _FastRun:
    """One fast-forwarded run; book() does it. Step j (1-based) repeats plan with contexts j tokens longer."""

    def __init__(self, replica: Replica, plan: StepPlan, runner: DecodeRunner, prices: Iterator[float],
                 max_steps: int) -> None:
        self.replica = replica
        self.plan = plan
        self.runner = runner
        self.prices = prices
        self.max_steps = max_steps
        scheduler = replica.scheduler
        self.requests = list(scheduler.running)
        self.bm = scheduler.block_manager
        bs = self.bm.block_size
        # computed tokens after plan (each step adds one) and the next step that needs a block / fills one
        self.computed = [r.num_computed_tokens for r in self.requests]
        self.allocs = [(len(r.block_table) * bs + 1 - c, i)
                       for i, (r, c) in enumerate(zip(self.requests, self.computed))]
        heapq.heapify(self.allocs)
        self.fills: list[tuple[int, int]] = []
        if self.bm.enable_prefix_caching:
            self.fills = [(bs - c % bs, i) for i, c in enumerate(self.computed)]
            heapq.heapify(self.fills)
        # the next token index each request has to write; overlapped: the in-flight step's too
        offset = 1 if replica.overlap else 0
        self.written = [c + 1 - offset for c in self.computed]

    def book(self) -> int:
        replica = self.replica
        clock = replica.clock
        horizon = replica.horizon()
        overlap = replica.overlap
        base = stats = self.plan.stats
        record_step = replica.record_step
        bm = self.bm
        free = bm.num_free_blocks
        step = 0
        previous_duration = 0.0
        allocs, fills = self.allocs, self.fills
        prices = self.prices
        # Steps the replica only sums (run(keep_steps=False) and no step hook) are added to its
        # totals after the run, as its records would have been: no StepStats or record per step.
        totals = replica.result.step_totals if replica.on_step is None else None
        while step < self.max_steps:
            now = clock.now()
            if now >= horizon:
                break
            if allocs and allocs[0][0] == step + 1:  # (most steps need no block: no call for them)
                due = self._due(step + 1)
                if len(due) > free:
                    for item in due:
                        heapq.heappush(allocs, item)
                    break
                free -= len(due)
                self._allocate(due)
            step += 1
            duration = next(prices)
            new_stats = self._stats(step) if totals is None else base
            if overlap:
                if step == 1:
                    assert replica.in_flight is not None, "an overlapped decode step is in flight"
                    previous_duration = replica.in_flight[1].result().duration_s
                clock.advance(previous_duration)
                if fills and fills[0][0] == step:
                    self._register(step)
                if totals is None:
                    record_step(clock.now() - previous_duration, previous_duration, stats, None, [])
                stats, previous_duration = new_stats, duration
            else:
                if fills and fills[0][0] == step:
                    self._register(step)
                clock.advance(duration)
                if totals is None:
                    record_step(now, duration, new_stats, None, [])
        if step:
            if totals is not None:  # what record_step would have summed: overlapped, the first record is plan's
                totals.count += step
                totals.requests += step * base.num_requests
                totals.prefill_tokens += base.num_prefill_tokens if overlap else 0
                stats = self._stats(step) if overlap else base  # the step left in flight
            self._finish(step, stats, previous_duration)
        return step

    def _stats(self, step: int) -> StepStats:
        """Step `step` of the run's StepStats (the free blocks as they are after its blocks came)."""
        base = self.plan.stats
        return StepStats(base.step + step, base.kind, base.num_requests, 0, base.num_decode_tokens,
                         base.num_waiting, base.num_running, self.bm.num_free_blocks, 0, 0,
                         base.repeated_kv_tokens, base.decode_repeated_kv_tokens)

    def _due(self, step: int) -> list[tuple[int, int]]:
        """The requests that need a block at step, popped in running order."""
        allocs = self.allocs
        due = []
        while allocs and allocs[0][0] == step:
            due.append(heapq.heappop(allocs))
        return due

    def _allocate(self, due: list[tuple[int, int]]) -> None:
        bs = self.bm.block_size
        for step, i in due:
            self.bm.allocate(self.requests[i], self.computed[i] + step)
            heapq.heappush(self.allocs, (step + bs, i))

    def _register(self, step: int) -> None:
        """Offer the blocks step fills to the prefix cache, their tokens written first."""
        fills = self.fills
        bs = self.bm.block_size
        while fills and fills[0][0] == step:
            _, i = heapq.heappop(fills)
            request = self.requests[i]
            end = self.computed[i] + step
            self._write(i, end)
            request.num_computed_tokens = end
            self.bm.register_computed(request, end)
            heapq.heappush(fills, (step + bs, i))

    def _write(self, i: int, end: int) -> None:
        """Write request i's sampled tokens at indices up to end (exclusive); overlapped, the token
        at end is still being sampled (a placeholder)."""
        self._write_many([(i, end)])

    def _write_many(self, ends: list[tuple[int, int]]) -> None:
        """_write for each (i, end), the tokens of all of them sampled in one call."""
        overlap = self.replica.overlap
        runs: list[tuple[str, int, int]] = []
        targets: list[int] = []
        for i, end in ends:
            request = self.requests[i]
            ids = request.token_ids
            if overlap and len(ids) <= end:
                ids.extend([PLACEHOLDER] * (end + 1 - len(ids)))
            start = self.written[i]
            if end > start:
                runs.append((request.request_id, start, end - start))
                targets.append(i)
                self.written[i] = end
        if not runs:
            return
        for i, (_, start, count), tokens in zip(targets, runs, self.runner.sample_runs(runs)):
            ids = self.requests[i].token_ids
            if overlap:
                ids[start : start + count] = tokens  # over placeholders
            else:
                ids.extend(tokens)

    def _finish(self, steps: int, last_stats: StepStats, last_duration: float) -> None:
        """Each request's counts after the run, and (overlapped) its last step put in flight."""
        replica = self.replica
        overlap = replica.overlap
        scheduler = replica.scheduler
        scheduler._step += steps
        entries: list[ScheduledRequest] = []
        ends: list[tuple[int, int]] = []
        for i, request in enumerate(self.requests):
            start = self.computed[i]
            end = start + steps
            high = request.max_computed_tokens
            if start < high:
                request.num_recomputed_tokens += min(end, high) - start
            if end > high:
                request.max_computed_tokens = end
            request.num_computed_tokens = end
            if overlap:
                ends.append((i, end))  # the last step's own token stays pending
                entries.append(ScheduledRequest(
                    request.request_id, [PLACEHOLDER], end - 1, request.block_table, True, request.sampling_params,
                    end - request.num_prompt_tokens, True))
            else:
                ends.append((i, end + 1))
        self._write_many(ends)
        if overlap:
            assert replica.in_flight is not None
            old = self.plan
            plan = StepPlan(entries, last_stats, [], [], old.use_cuda_graphs)
            runs = [(e.request_id, e.num_computed_tokens + 1, 1) for e in entries]
            tokens = [run[0] for run in self.runner.sample_runs(runs)]
            _, pending, _ = replica.in_flight
            replica.in_flight = (plan, self.runner.resubmitted(pending, StepResult(tokens, last_duration)),
                                 replica.clock.now())

