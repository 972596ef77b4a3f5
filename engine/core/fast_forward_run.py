"""One fast-forwarded run (engine.core.fast_forward): its segments, events and records.

Steps are numbered from the template (step 0): step j repeats it with every context j tokens
longer. Request i (computed[i] tokens after the template) computes token computed[i] + j - 1 at
step j and samples the token at computed[i] + j; it samples its last token at step last[i], then
leaves the batch. A segment is a stretch of steps with one batch: it ends with a step at which a
request samples its last token, or after block_size steps (so that no request needs two blocks
or fills two within one segment). Its steps are priced and timed as arrays, then the events in
it (a block needed, a block filled) are applied in order; the requests leave; the next segment
starts if the policy still plans the same batch without them. Tokens are written once, at the
end of the run, except those a filled block's prefix-cache key is computed from.
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.core.kv_reads import step_repeated_reads
from engine.core.plan import PLACEHOLDER, ScheduledRequest, StepPlan, StepResult, StepStats
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.step_log import StepRecord, StepRun

if TYPE_CHECKING:
    from engine.core.async_scheduler import AsyncScheduler
    from engine.core.fast_forward import DecodeRunner
    from engine.core.loop import Replica

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
_NEVER = 1 << 62  # a step after every step


class FastRun:
    """book() books the run after plan (the template step) and returns its number of steps."""

    def __init__(self, replica: Replica, plan: StepPlan, runner: DecodeRunner, left: list[int]) -> None:
        self.replica = replica
        self.plan = plan
        self.runner = runner
        self.scheduler = scheduler = replica.scheduler
        self.bm = bm = scheduler.block_manager
        self.overlap = replica.overlap
        self.requests = requests = list(scheduler.running)
        self.last = left
        bs = self.bs = bm.block_size
        self.computed = computed = [r.num_computed_tokens for r in requests]
        # (step, request index) heaps: the next step at which a request needs a block, fills one
        self.allocs = [(len(r.block_table) * bs + 1 - c, i) for i, (r, c) in enumerate(zip(requests, computed))]
        heapq.heapify(self.allocs)
        self.fills: list[tuple[int, int]] = []
        if bm.enable_prefix_caching:
            self.fills = [(bs - c % bs, i) for i, c in enumerate(computed)]
            heapq.heapify(self.fills)
        self.leaving = sorted(zip(left, range(len(requests))))  # (last step, index), read from the front
        self.next_leaving = 0
        self.batch = list(range(len(requests)))  # the requests in the batch, in batch order
        # the next token index each request has to write (overlapped: the template's, still pending)
        self.written = [c + (0 if self.overlap else 1) for c in computed]
        self.step = 0  # the last step planned
        # planned steps for the records: (first step's stats, durations, free blocks after each)
        self.groups: list[tuple[StepStats, Floats, Ints]] = []
        self.times: list[Floats] = []  # plain: each planned step's start; overlapped: each completed step's end
        self.finished: dict[int, list[Request]] = {}  # step -> the requests it finishes, in batch order
        self.completed_at: dict[int, float] = {}  # overlapped: step -> when it completed

    def book(self) -> int:
        replica = self.replica
        horizon = replica.horizon()
        overlap = self.overlap
        t = replica.clock.now()  # plain: the next step's start; overlapped: when the next is planned
        previous = 0.0  # overlapped: the duration of the step in flight
        plan = base = self.plan
        if overlap:
            assert replica.in_flight is not None, "an overlapped decode step is in flight"
            previous = replica.in_flight[1].result().duration_s
            self.groups.append((base.stats, np.array([previous]), np.array([base.stats.num_free_blocks])))
        while True:
            first = self.step + 1
            leaves_at = self.leaving[self.next_leaving][0]
            end = min(leaves_at, first + self.bs - 1)
            due, fits = self._blocks_due(first, end)
            durations, times = self._timed(plan, first, fits - first + 1, t, previous, horizon)
            steps = len(durations)
            if not steps:
                break
            last = first + steps - 1
            frees = self._apply(first, last, due)
            if overlap:
                self.times.append(times[1 : steps + 1])
                self.completed_at[first - 1] = float(times[1])
                t, previous = float(times[steps]), float(durations[-1])
            else:
                self.times.append(times[:steps])
                t = float(times[steps])
            self.step = last
            group = replace(plan.stats, step=base.stats.step + first, num_free_blocks=int(frees[0]))
            if last < end or end < leaves_at:  # cut (the horizon or the blocks), or a stretch without a finish
                self.groups.append((group, durations, frees))
                if last < end:
                    break
                continue
            next_plan = self._leave(last, t, group, durations, frees)
            if next_plan is None:
                break
            plan = next_plan
        if self.step:
            self._end(t, previous)
        elif overlap:  # nothing booked: the template goes back in flight, unread
            assert replica.in_flight is not None
            pending = replica.in_flight[1]
            replica.in_flight = (base, self.runner.resubmitted(pending, pending.result()), replica.in_flight[2])
        return self.step

    # ---- one segment -------------------------------------------------------------------------

    def _blocks_due(self, first: int, end: int) -> tuple[list[tuple[int, int]], int]:
        """The blocks steps first..end need, (step, request) in order, and the last step up to
        which they fit: the step-by-step path preempts at the first step that lacks one."""
        allocs, last = self.allocs, self.last
        due = []
        while allocs and allocs[0][0] <= end:
            j, i = heapq.heappop(allocs)
            if last[i] >= j:
                due.append((j, i))
        free = self.bm.num_free_blocks
        if len(due) > free:
            short = due[free][0]
            return [d for d in due if d[0] < short], short - 1
        return due, end

    def _timed(self, plan: StepPlan, first: int, count: int, t: float, previous: float,
               horizon: float) -> tuple[Floats, Floats]:
        """Durations of the steps from first on (at most count) that start before horizon, and
        the clock along them: plain, times[m] is step first + m's start; overlapped, when it is
        planned (the step before it completes then). The clock adds them one at a time."""
        if count <= 0:
            return np.empty(0), np.empty(0)
        runner = self.runner
        durations = runner.decode_price_array(plan, first, count)
        if durations is not None:
            lead = [t, previous] if self.overlap else [t]
            times = np.cumsum(np.concatenate((lead, durations)))
            return durations[: int(np.searchsorted(times[:count], horizon, side="left"))], times
        # priced one at a time (a cost model with state): never a step past the horizon
        prices = runner.decode_prices(plan if first == 1 else _shifted(plan, first - 1))
        taken: list[float] = []
        clock = [t]
        for _ in range(count):
            if t >= horizon:
                break
            taken.append(next(prices))
            t += (previous if len(taken) == 1 else taken[-2]) if self.overlap else taken[-1]
            clock.append(t)
        return np.array(taken, dtype=np.float64), np.array(clock, dtype=np.float64)

    def _apply(self, first: int, last: int, due: list[tuple[int, int]]) -> Ints:
        """Allocate and register steps first..last's blocks, in the step-by-step path's order (per
        step: its blocks in running order, then the blocks it fills in batch order); returns the
        free blocks after each step's allocations."""
        bm, requests, computed, bs = self.bm, self.requests, self.computed, self.bs
        if due and due[-1][0] > last:
            due = [d for d in due if d[0] <= last]
        fills = self._fills_due(last)
        if fills:
            self._write([(i, computed[i] + j) for j, i in fills])
        frees = np.full(last - first + 1, bm.num_free_blocks, dtype=np.int64)
        allocs, stop = self.allocs, self.last
        a = f = 0
        while a < len(due) or f < len(fills):
            j = min(due[a][0] if a < len(due) else _NEVER, fills[f][0] if f < len(fills) else _NEVER)
            while a < len(due) and due[a][0] == j:
                i = due[a][1]
                bm.allocate(requests[i], computed[i] + j)
                frees[j - first :] -= 1
                if j + bs <= stop[i]:
                    heapq.heappush(allocs, (j + bs, i))
                a += 1
            while f < len(fills) and fills[f][0] == j:
                i = fills[f][1]
                request, end = requests[i], computed[i] + j
                request.num_computed_tokens = end
                bm.register_computed(request, end)
                f += 1
        return frees

    def _fills_due(self, last: int) -> list[tuple[int, int]]:
        """The blocks steps up to last fill, (step, request) in order. Plain, a request's last
        step registers its blocks before it finishes; overlapped, a block is registered when the
        step after the one that filled it is planned, by then without the requests that left."""
        heap, stop, bs = self.fills, self.last, self.bs
        latest = 0 if self.overlap else 1  # a fill at step j counts while j < last[i] + latest
        fills = []
        while heap and heap[0][0] <= last:
            j, i = heapq.heappop(heap)
            if j < stop[i] + latest:
                fills.append((j, i))
                if j + bs < stop[i] + latest:
                    heapq.heappush(heap, (j + bs, i))
        return fills

    def _leave(self, last: int, t: float, group: StepStats, durations: Floats, frees: Ints) -> StepPlan | None:
        """Step last ended with requests sampling their last tokens: they leave the batch (their
        blocks freed; plain, they finish at t). Returns the next segment's template, or None where
        the policy would not plan the rest of the batch again (or nothing is left)."""
        scheduler, bm, requests = self.scheduler, self.bm, self.requests
        leaving = []
        while self.next_leaving < len(self.leaving) and self.leaving[self.next_leaving][0] == last:
            leaving.append(requests[self.leaving[self.next_leaving][1]])
            self.next_leaving += 1
        self.finished[last] = leaving
        if self.overlap:
            finishing = cast_async(scheduler).finishing
            for request in leaving:  # NOTE: frees commute with the fills _apply made at this step
                bm.free(request)
                finishing[request.request_id] = request
            scheduler.running = [r for r in scheduler.running if r.request_id not in finishing]
            if len(durations) > 1:
                self.groups.append((group, durations[:-1], frees[:-1]))
            free = bm.num_free_blocks
            self.groups.append((replace(group, step=group.step + len(durations) - 1, num_running=len(scheduler.running),
                                        num_free_blocks=free), durations[-1:], np.array([free])))
        else:
            self.groups.append((group, durations, frees))
            for request in leaving:
                scheduler._finish(request, FinishReason.LENGTH, t)
            scheduler.running = [r for r in scheduler.running if r.status is RequestStatus.RUNNING]
        if not scheduler.running or not scheduler.policy.repeats_decode(scheduler):
            return None
        stopped = self.last
        self.batch = batch = [i for i in self.batch if stopped[i] > last]
        entries = [self.plan.scheduled[i] for i in batch]
        repeated, decode_repeated = step_repeated_reads(entries, bm, len(entries))
        n, bs = len(entries), self.bs
        stats = StepStats(self.plan.stats.step, "decode", n, 0, n, group.num_waiting, n, 0, 0, 0, repeated * bs,
                          decode_repeated * bs)
        return StepPlan(entries, stats, [], [], self.plan.use_cuda_graphs)

    # ---- the end of the run --------------------------------------------------------------------

    def _write(self, ends: list[tuple[int, int]]) -> None:
        """Write request i's sampled tokens up to index end (exclusive) for each (i, end), all
        sampled in one call."""
        requests, written = self.requests, self.written
        ends = [(i, end) for i, end in ends if end > written[i]]
        runs = [(requests[i].request_id, written[i], end - written[i]) for i, end in ends]
        for (i, end), tokens in zip(ends, self.runner.sample_runs(runs)):
            ids = requests[i].token_ids
            del ids[written[i] :]  # overlapped: the template's placeholder
            ids.extend(tokens)
            written[i] = end

    def _end(self, t: float, previous: float) -> None:
        """Each request's tokens and counts after the run, the finished ones finished (overlapped)
        and recorded, the clock moved on, and (overlapped) the last step put in flight."""
        replica, scheduler, requests, computed = self.replica, self.scheduler, self.requests, self.computed
        steps, stop, overlap = self.step, self.last, self.overlap
        for i, request in enumerate(requests):
            start, end = computed[i], computed[i] + min(steps, stop[i])
            high = request.max_computed_tokens
            if start < high:
                request.num_recomputed_tokens += min(end, high) - start
            if end > high:
                request.max_computed_tokens = end
            request.num_computed_tokens = end
        # each request's tokens up to the one its last step samples (overlapped, in flight: pending)
        self._write([(i, c + min(steps, stop[i]) + 1) for i, c in enumerate(computed)])
        scheduler._step += steps
        if overlap:
            finishing = cast_async(scheduler).finishing
            for step, leaving in self.finished.items():
                if step < steps:
                    for request in leaving:
                        del finishing[request.request_id]
                        request.num_pending_tokens = 0
                        scheduler._finish(request, FinishReason.LENGTH, self.completed_at[step])
        self._record()
        replica.clock.wait_until(t)  # the clock is at t exactly: the sum the steps added up to
        if overlap:
            flight = [i for i in range(len(requests)) if stop[i] >= steps]
            entries, tokens = [], []
            for i in flight:
                request, end = requests[i], computed[i] + steps
                tokens.append(request.token_ids[-1])
                request.token_ids[-1] = PLACEHOLDER
                entries.append(ScheduledRequest(request.request_id, [PLACEHOLDER], end - 1, request.block_table, True,
                                                request.sampling_params, end - request.num_prompt_tokens, True))
            stats, _, frees = self.groups[-1]
            stats = replace(stats, step=self.plan.stats.step + steps, num_free_blocks=int(frees[-1]))
            assert replica.in_flight is not None
            plan = StepPlan(entries, stats, [], [], self.plan.use_cuda_graphs)
            result = StepResult(tokens, previous)
            replica.in_flight = (plan, self.runner.resubmitted(replica.in_flight[1], result), replica.clock.now())

    def _record(self) -> None:
        """Hand the replica its steps: a StepRun per batch (a StepRecord where it ran one step)."""
        durations = np.concatenate([g[1] for g in self.groups])
        times = np.concatenate(self.times)
        if self.overlap:  # times are the completed steps' ends; the last step planned is in flight
            starts = times - durations[: len(times)]
        else:
            starts = times
        offset, recorded, base = 0, len(times), self.plan.stats.step
        for stats, group_durations, frees in self.groups:
            count = min(len(group_durations), recorded - offset)
            if count <= 0:
                break
            step_starts = starts[offset : offset + count]
            finished = self.finished.get(stats.step - base + count - 1, []) if count == len(group_durations) else []
            if count == 1:
                item: StepRecord | StepRun = StepRecord(float(step_starts[0]), float(group_durations[0]),
                                                       replace(stats, num_free_blocks=int(frees[0])))
            else:
                item = StepRun(stats, step_starts, group_durations[:count], frees[:count])
            self.replica.record_steps(item, finished)
            offset += count


def _shifted(plan: StepPlan, by: int) -> StepPlan:
    """plan's repeat `by` as a plan: each entry's context (and outputs) by tokens further."""
    entries = [ScheduledRequest(e.request_id, e.token_ids, e.num_computed_tokens + by, e.block_table, e.sample,
                                e.sampling_params, e.num_output_tokens + by, e.is_decode) for e in plan.scheduled]
    return StepPlan(entries, replace(plan.stats, step=plan.stats.step + by), [], [], plan.use_cuda_graphs)


def cast_async(scheduler: object) -> AsyncScheduler:
    """The scheduler of overlapped steps (engine.core.loop.step_overlap checked its class)."""
    return scheduler  # type: ignore[return-value]
