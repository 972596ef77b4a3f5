"""The pieces of a fast-forwarded run (engine.core.fast_forward): its members, the booked step
in flight, groups of booked steps for the records, and the writing of members' requests.

A member's tokens are all written when it joins (sample()): only the prefix cache reads them while
the run books it (the blocks the booked steps filled); a member that finishes has all its tokens,
and a run that closes cuts those of steps it did not book (truncate()). Its counters are written
when it finishes or the run closes (settle()).
"""

from __future__ import annotations

from array import array
from dataclasses import replace
from typing import TYPE_CHECKING

from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.request import Request

if TYPE_CHECKING:
    from engine.core.async_scheduler import AsyncScheduler
    from engine.core.fast_forward import DecodeRunner


class Member:
    """A request in the batch of a run, and what the run owes its Request."""

    __slots__ = ("request", "entry", "offset", "last", "start", "written", "seq")

    def __init__(self, request: Request, entry: ScheduledRequest, offset: int, start: int, written: int,
                 seq: int) -> None:
        self.request = request
        self.entry = entry  # as a decode entry of step 0 (num_computed_tokens offset - 1): what prices read
        self.offset = offset
        self.last = request.num_prompt_tokens + request.max_tokens - 1 - offset  # type: ignore[operator]
        self.start = start  # its computed tokens when it joined
        self.written = written  # from here on its tokens are written by sample() (before: by the scheduler)
        self.seq = seq  # joins in running order: ties between members go by it


class Flight:
    """Overlapped steps: the booked step in flight (planned, not yet completed)."""

    __slots__ = ("stats", "duration", "members", "leavers", "key")

    def __init__(self, stats: StepStats, duration: float, members: list[Member]) -> None:
        self.stats = stats
        self.duration = duration
        self.members = members  # its batch, in batch order (the run's list then: replaced, never changed)
        self.leavers: list[Member] = []  # those that sample their last token in it
        self.key: object = None  # its record's Group key (None: it differs from the steps around it)


class Group:
    """Consecutive booked steps of one batch, for the records: step k of it is stats with step
    stats.step + k and free_blocks[k] free blocks, and ran from starts[k] for durations[k]."""

    __slots__ = ("stats", "starts", "durations", "free_blocks", "finished", "key")

    def __init__(self, stats: StepStats, starts: list[float], durations: list[float], free_blocks: list[int],
                 key: object) -> None:
        self.stats = stats
        self.starts = starts
        self.durations = durations
        self.free_blocks = free_blocks
        self.finished: list[Member] = []  # the requests its last step finished
        self.key = key  # steps of equal keys are stats alike but for step and free blocks (None: alone)


def sample(runner: DecodeRunner, members: list[Member]) -> None:
    """Write each member's tokens from its first unwritten index to its last token, sampled in one
    call (DecodeRunner.sample_runs: one numpy pass)."""
    if not members:
        return
    runs = [(m.request.request_id, m.written, m.offset + m.last + 1 - m.written) for m in members]
    for member, tokens in zip(members, runner.sample_runs(runs)):
        ids = member.request.token_ids
        del ids[member.written :]  # overlapped: the placeholder of the step in flight
        # (packed ids take packed tokens as bytes; a list takes ints, made in one call)
        if isinstance(ids, list):
            ids.extend(tokens.tolist() if isinstance(tokens, array) else tokens)
        else:
            ids.extend(array("q", tokens) if isinstance(tokens, list) else tokens)


def truncate(members: list[Member], steps: int) -> None:
    """Cut each member's tokens after the one its step `steps` samples (its last, if sooner)."""
    for member in members:
        del member.request.token_ids[member.offset + min(steps, member.last) + 1 :]


def settle(members: list[Member], steps: list[int]) -> None:
    """Each member's counters after `steps` booked steps (those it was in)."""
    for member, step in zip(members, steps):
        request = member.request
        start, end = member.start, member.offset + step
        if end == start:
            continue
        high = request.max_computed_tokens
        if start < high:
            request.num_recomputed_tokens += min(end, high) - start
        if end > high:
            request.max_computed_tokens = end
        request.num_computed_tokens = end


def shifted(plan: StepPlan, by: int) -> StepPlan:
    """plan's repeat `by` as a plan: each entry's context (and outputs) by tokens further."""
    if not by:
        return plan
    entries = [ScheduledRequest(e.request_id, e.token_ids, e.num_computed_tokens + by, e.block_table, e.sample,
                                e.sampling_params, e.num_output_tokens + by, e.is_decode, e.prefix_key)
               for e in plan.scheduled]
    return StepPlan(entries, replace(plan.stats, step=plan.stats.step + by), [], [], plan.use_cuda_graphs)


def cast_async(scheduler: object) -> AsyncScheduler:
    """The scheduler of overlapped steps (engine.core.loop.step_overlap checked its class)."""
    return scheduler  # type: ignore[return-value]
