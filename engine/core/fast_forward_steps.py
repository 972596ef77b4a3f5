"""The booking of decode steps for engine.core.fast_forward: segments and the events in them.

Steps of a run are numbered from its template (step 0). A member (a request in the batch)
computes token offset + j - 1 at step j and samples the token at offset + j; it samples its last
token at step `last`, then leaves the batch. A segment is a stretch of steps with one batch: it
ends at a step where members leave, or after block_size steps (so that no member needs two
blocks or fills two within it). Its steps are priced and timed as arrays; then the events in it
(a block needed, a block filled) are applied in the step-by-step path's order, and the members
that sampled their last tokens leave (engine.core.fast_forward_parts holds the pieces).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.core.fast_forward_clock import timed
from engine.core.fast_forward_parts import Flight, Group, Member, cast_async
from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.step_log import restamp

if TYPE_CHECKING:
    from engine.core.fast_forward import DecodeRunner
    from engine.core.loop import Replica

_NEVER = 1 << 62  # a step after every step


class Booking:
    """The booked state of a run: its batch, the steps planned, and the segment machinery."""

    def __init__(self, replica: Replica, runner: DecodeRunner) -> None:
        self.replica = replica
        self.runner = runner
        self.scheduler = replica.scheduler
        self.bm = self.scheduler.block_manager
        self.bs = self.bm.block_size
        self.overlap = replica.overlap
        self.batch: list[Member] = []
        self.allocs: list[tuple[int, int, Member]] = []  # (step, seq, member): the next block a member needs
        self.fills: list[tuple[int, int, Member]] = []  # the next block a member fills
        self.leaving: list[tuple[int, int, Member]] = []  # (last step, seq, member)
        self.seq = 0
        self.step = 0  # the last step planned
        self.t = replica.clock.now()  # plain: the next step's start; overlapped: when the next is planned
        self.previous = 0.0  # overlapped: the duration of the step in flight
        self.previous_priced = 0.0  # the last step's booked (how many steps the horizon leaves room for)
        self.arrays = True  # the runner prices repeats in any number at once (else one at a time)
        self.flight: Flight | None = None
        self.groups: list[Group] = []  # booked steps not yet handed to the replica
        self.finished: list[Member] = []  # members finished, their requests not yet written
        self.stats: StepStats | None = None  # a segment's first step's stats (step number aside)
        self.plan: StepPlan | None = None  # what a segment's steps are priced from

    def join(self, request: Request, entry: ScheduledRequest, first: int, written: int, skip_fill: bool) -> Member:
        """Add a request to the batch from step `first` on (its computed tokens and blocks as they
        are now). skip_fill: its block filled at `first` is registered by the step in flight.
        sample() must follow, for the members that joined."""
        computed = request.num_computed_tokens
        offset = computed - first + 1
        member = Member(request, entry, offset, computed, written, self.seq)
        self.seq += 1
        self.batch.append(member)
        heapq.heappush(self.allocs, (len(request.block_table) * self.bs - offset + 1, member.seq, member))
        if self.bm.enable_prefix_caching:
            fill = first + (-(offset + first)) % self.bs
            if skip_fill and fill == first:
                fill += self.bs
            if fill <= member.last:
                heapq.heappush(self.fills, (fill, member.seq, member))
        heapq.heappush(self.leaving, (member.last, member.seq, member))
        return member

    # ---- one segment ---------------------------------------------------------------------------

    def segment(self, horizon: float, land: Callable[[float, bool], None] | None = None) -> str:
        """Book the next segment; returns how it ended: "cut" (the horizon), "blocks" (a step lacks
        blocks: a preemption), "stretch" (block_size steps) or "leave" (members sampled their last
        tokens). land: overlapped, a prefill is in flight; it lands (land(planned_at, True)) once
        the segment's first step is planned, if more steps follow in it (else the caller lands it)."""
        assert self.stats is not None
        first = self.step + 1
        leaves_at = self.leaving[0][0]
        end = min(leaves_at, first + self.bs - 1)
        due, fits = self._blocks_due(first, end)
        durations, times = timed(self, first, fits - first + 1, horizon)
        steps = len(durations)
        if not steps:
            for event in due:
                heapq.heappush(self.allocs, event)
            return "blocks" if fits < first else "cut"
        last = first + steps - 1
        # overlapped, the step that members leave at frees their blocks when planned, before the
        # step in flight completes and registers the blocks it filled
        deferred: list[tuple[int, int, Member]] = []
        defer = deferred if self.overlap and last == leaves_at and (land is None or last > first) else None
        if land is not None and last > first:  # its first step's blocks are registered as it is planned
            frees = self._apply(first, first, [d for d in due if d[0] == first], None)
            land(times[0], True)
            frees += self._apply(first + 1, last, [d for d in due if d[0] > first], defer)
        else:
            frees = self._apply(first, last, due, defer)
        template = self.stats
        stats = restamp(template, template.step + first, frees[0])
        if self.overlap:  # completed: the step in flight, then first .. last - 1; last is in flight
            if self.flight is not None:
                self.complete_flight(times[1])
            if steps > 1:
                self.record(stats, [times[m + 1] - durations[m - 1] for m in range(1, steps)], durations[:-1],
                            frees[:-1], template)
            self.flight = Flight(restamp(template, template.step + last, frees[-1]), durations[-1], self.batch)
            self.flight.key = template
            self.previous = durations[-1]
        else:
            self.record(stats, times[:steps], durations, frees, template)
        self.t = times[steps]
        self.step = last
        if last < end:
            return "blocks" if last == fits < end else "cut"
        if last < leaves_at:
            return "stretch"
        self._leave(last)
        self._register(deferred)
        return "leave"

    def record(self, stats: StepStats, starts: list[float], durations: list[float], free_blocks: list[int],
               key: object) -> Group:
        """Keep booked steps for the records, with the group before them where they continue it."""
        groups = self.groups
        if groups:
            group = groups[-1]
            if key is not None and group.key is key and not group.finished and \
                    group.stats.step + len(group.durations) == stats.step:
                group.starts += starts
                group.durations += durations
                group.free_blocks += free_blocks
                return group
        group = Group(stats, starts, durations, free_blocks, key)
        groups.append(group)
        return group

    def _blocks_due(self, first: int, end: int) -> tuple[list[tuple[int, int, Member]], int]:
        """The blocks steps first..end need, in order, and the last step up to which they fit: the
        step-by-step path preempts at the first step that lacks one."""
        allocs = self.allocs
        due = []
        while allocs and allocs[0][0] <= end:
            event = heapq.heappop(allocs)
            if event[2].last >= event[0]:
                due.append(event)
        free = self.bm.num_free_blocks
        if len(due) > free:
            short = due[free][0]
            return due, short - 1  # (_apply puts the steps' after short-1 back)
        return due, end

    def _apply(self, first: int, last: int, due: list[tuple[int, int, Member]],
               deferred: list[tuple[int, int, Member]] | None) -> list[int]:
        """Allocate and register the blocks of steps first..last in the step-by-step path's order
        (per step: the blocks it needs in running order, then those it fills in batch order; the
        fills of step last go to deferred where given); returns the free blocks after each step's
        allocations."""
        bm, bs = self.bm, self.bs
        if due and due[-1][0] > last:  # the steps after last are booked later (or never): their blocks wait
            for event in due:
                if event[0] > last:
                    heapq.heappush(self.allocs, event)
            due = [d for d in due if d[0] <= last]
        fills = self._fills_due(last)
        free = bm.num_free_blocks
        drops = []  # the steps (from first) whose allocations leave fewer blocks free
        a = f = 0
        while a < len(due) or f < len(fills):
            j = min(due[a][0] if a < len(due) else _NEVER, fills[f][0] if f < len(fills) else _NEVER)
            while a < len(due) and due[a][0] == j:
                member = due[a][2]
                bm.allocate_next(member.request)  # (one block: the step's token starts it)
                drops.append(j - first)
                if j + bs <= member.last:
                    heapq.heappush(self.allocs, (j + bs, member.seq, member))
                a += 1
            if deferred is not None and j == last:
                deferred += fills[f:]
                break
            while f < len(fills) and fills[f][0] == j:
                self._register([fills[f]])
                f += 1
        steps = last - first + 1
        if not drops:
            return [free] * steps
        frees: list[int] = []
        at = 0
        for drop in drops:
            frees += [free] * (drop - at)
            free -= 1
            at = drop
        return frees + [free] * (steps - at)

    def _register(self, fills: list[tuple[int, int, Member]]) -> None:
        for j, _, member in fills:
            request, end = member.request, member.offset + j
            request.num_computed_tokens = end
            if request.block_table:
                self.bm.register_computed(request, end)
            else:  # overlapped: it left at this step, its blocks freed as the step was planned
                overlapped = cast_async(self.scheduler)
                freed = overlapped.take_freed(request.request_id)
                if freed is not None:
                    overlapped.offer_freed(request, freed, end)

    def _fills_due(self, last: int) -> list[tuple[int, int, Member]]:
        """The blocks steps up to last fill, in order (a member's last step's too: overlapped, once
        the members that left at it were freed, engine.core.async_scheduler)."""
        heap, bs = self.fills, self.bs
        fills = []
        while heap and heap[0][0] <= last:
            event = heapq.heappop(heap)
            j, seq, member = event
            fills.append(event)
            if j + bs <= member.last:
                heapq.heappush(heap, (j + bs, seq, member))
        return fills

    def _leave(self, last: int) -> None:
        """Members sampled their last tokens at step last: they leave the batch, their blocks freed
        (overlapped: as the step is planned, engine.core.async_scheduler; plain: as it ends, and
        they finish then)."""
        scheduler, bm = self.scheduler, self.bm
        leavers = []
        while self.leaving and self.leaving[0][0] == last:
            leavers.append(heapq.heappop(self.leaving)[2])
        if self.overlap:
            assert self.flight is not None
            overlapped = cast_async(scheduler)
            finishing = overlapped.finishing
            for member in leavers:  # NOTE: frees commute with the registrations _apply made at this step
                overlapped.keep_freed(member.request)  # its last step's block: offered once its token is known
                bm.free(member.request)
                finishing[member.request.request_id] = member.request
            scheduler.running = [r for r in scheduler.running if r.request_id not in finishing]
            flight = self.flight
            flight.stats = restamp(flight.stats, flight.stats.step, bm.num_free_blocks, len(scheduler.running))
            flight.leavers = leavers
            flight.key = None
        else:
            for member in leavers:
                scheduler._finish(member.request, FinishReason.LENGTH, self.t)
            scheduler.running = [r for r in scheduler.running if r.status is RequestStatus.RUNNING]
            self.groups[-1].finished += leavers
            self.finished += leavers
        self.batch = [m for m in self.batch if m.last > last]
        self.stats = None  # a new batch: new stats and prices

    def complete_flight(self, at: float) -> None:
        """Overlapped: the booked step in flight completed at `at`; the members that left with it finish."""
        flight = self.flight
        assert flight is not None
        group = self.record(flight.stats, [at - flight.duration], [flight.duration], [flight.stats.num_free_blocks],
                            flight.key)
        if flight.leavers:
            group.finished += flight.leavers
            scheduler = self.scheduler
            overlapped = cast_async(scheduler)
            finishing = overlapped.finishing
            for member in flight.leavers:
                request = member.request
                del finishing[request.request_id]
                overlapped.take_freed(request.request_id)  # its tokens landed: nothing more to offer
                request.num_pending_tokens = 0
                scheduler._finish(request, FinishReason.LENGTH, at)
            self.finished += flight.leavers
        self.flight = None
