"""Overlapped steps: the runner queues step N+1 on the device before step N's tokens are read.

The core plans step N+1 while step N runs (engine.core.loop), so a request that sampled in step N
decodes in step N+1 with engine.core.plan.PLACEHOLDER as its input token. The runner keeps
step N's sampled ids on the device and copies each one into the input row of its placeholder
(an index_select and an index_copy queued before the forward: no host sync). The sampled ids go
to a pinned host buffer by a non-blocking copy; PendingTokens.result() waits on an event
recorded after it.

Timing comes from CUDA events around each step's device work: duration_s runs from when the step
could start on the device (its first queued work, or the previous step's end if later) to its
end, and idle_s is the gap before it, when the device had nothing queued. ready_age_s says how
long before result() returned the ids were on the host (the end event, mapped to the host's
clock through an anchor event taken whenever submit() finds the device idle): the loop reads step N only after it
has launched step N+1, which for an eager prefill takes tens of milliseconds of Python, and the
tokens should not be stamped late by that. On CPU, where queuing
is executing, duration_s is the wall time of submit() and idle_s the wall time since the
previous submit() returned.

StepOverlap holds what one submitted step leaves for the next: its sampled ids on the device,
each sampling request's row in them, the device clock and the pinned buffers the ids come back
through. The runner queues the step's device work itself, on the same path as a plain step
(engine.runner).

Under tensor parallelism every rank fills its placeholders, from the same ids. Usually every
rank holds them already: each sampled its slice of the vocabulary and all picked the token from
the same exchanged bests (engine.sharded_sampling), one reduction over identical bytes, so the
ids agree bit for bit without a broadcast. Where the ranks gathered the logits instead (a top-k
or top-p row), rank 0 alone samples and broadcasts the ids through the process group right
after sampling (a device-side collective queued on the stream, NCCL on GPU), and the other ranks
receive them into their own last_sampled: ranks sampling the whole vocabulary each for itself
would have to agree on every top-p cut-off, and a disagreement would silently split their KV
caches. Rank 0 sends each step's placeholder map (rows, sources) along with its batch, so that
a worker needs no plan and no request ids.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.core.plan import PLACEHOLDER, StepPlan, StepResult
from engine.host_staging import HostStaging
from engine.step_sampling import tokens_per_entry

# (input rows holding a placeholder, row of the previous step's sampled ids to copy there), or
# None when a step has none
Placeholders = tuple[np.ndarray, np.ndarray] | None


def placeholder_sources(plan: StepPlan, query_start_loc: np.ndarray, input_ids: np.ndarray,
                        previous_rows: dict[str, int]) -> Placeholders:
    """(input rows holding a placeholder, row of the previous step's sampled ids to copy there),
    or None when the step has no placeholder. Zeroes the placeholders in input_ids."""
    num_tokens = int(query_start_loc[-1])
    rows = np.flatnonzero(input_ids[:num_tokens] == PLACEHOLDER)
    if not len(rows):
        return None
    entries = plan.scheduled
    # a placeholder is always its entry's last token: the entry is the one whose rows end there
    owners = np.searchsorted(query_start_loc, rows, side="right") - 1
    try:
        sources = np.fromiter((previous_rows[entries[i].request_id] for i in owners.tolist()), np.int64, len(rows))
    except KeyError as error:
        raise RuntimeError(f"request {error.args[0]!r} has a placeholder input but sampled nothing in the "
                           "previous step: the loop may only overlap one step") from None
    input_ids[rows] = 0
    return rows.astype(np.int64), sources


@dataclass
class DeviceClock:
    """End of the previous step on the device, to measure the next step's idle gap against."""

    last_end: torch.cuda.Event | None = None
    last_return: float | None = None  # CPU: when the previous submit() returned
    # an event completed at a known perf_counter() time: maps later events to the host's clock
    anchor: torch.cuda.Event | None = None
    anchor_wall: float = 0.0

    def set_anchor(self) -> None:
        """Call with nothing queued on the device (the runner does whenever it finds it idle)."""
        self.anchor = torch.cuda.Event(enable_timing=True)
        self.anchor.record()
        self.anchor.synchronize()
        self.anchor_wall = time.perf_counter()


@dataclass
class PendingTokens:
    """One submitted step: result() waits for its sampled ids and returns the StepResult."""

    num_entries: int
    sample_rows: list[int]
    host_ids: torch.Tensor | None  # pinned [num_sampled], filled by a non-blocking copy
    start: torch.cuda.Event | None
    end: torch.cuda.Event | None
    previous_end: torch.cuda.Event | None
    wall_duration_s: float = 0.0
    wall_idle_s: float | None = None
    clock: DeviceClock | None = None  # for the ready time of the ids (its anchor)
    on_done: object = None  # callable run once the step's events are complete (the step timer)
    _taken: bool = field(default=False, repr=False)

    def result(self) -> StepResult:
        if self._taken:
            raise RuntimeError("PendingTokens.result() called twice for one step")
        self._taken = True
        age = 0.0
        if self.end is not None:
            self.end.synchronize()
            duration = self.start.elapsed_time(self.end) / 1e3
            idle = 0.0 if self.previous_end is None else max(0.0, self.previous_end.elapsed_time(self.start) / 1e3)
            clock = self.clock
            if clock is not None and clock.anchor is not None:
                ready = clock.anchor_wall + clock.anchor.elapsed_time(self.end) / 1e3
                age = max(0.0, time.perf_counter() - ready)
        else:
            duration, idle = self.wall_duration_s, self.wall_idle_s
        sampled = [] if self.host_ids is None else self.host_ids.tolist()
        tokens = tokens_per_entry(self.num_entries, self.sample_rows, sampled)
        if self.on_done is not None:
            self.on_done()
        return StepResult(tokens, duration, idle, age)

    def sampled(self) -> list[int]:
        """The step's token per entry (-1 where it samples none) once they are on the host, without
        taking the result: a thread may hand them on while the loop submits the next step (the
        event's synchronize() releases the GIL). The pinned buffer holds them until the step after
        next is submitted, which the loop does only after result()."""
        if self.end is not None:
            self.end.synchronize()
        ids: list[int] = [] if self.host_ids is None else self.host_ids.tolist()
        return tokens_per_entry(self.num_entries, self.sample_rows, ids)


def wall_pending(clock: DeviceClock, started: float, num_entries: int, sample_rows: list[int],
                 sampled: torch.Tensor | None) -> PendingTokens:
    """A CPU step, already computed: its wall times stand in for the device's."""
    now = time.perf_counter()
    idle = None if clock.last_return is None else max(0.0, started - clock.last_return)
    clock.last_return = now
    return PendingTokens(num_entries, sample_rows, sampled, None, None, None, now - started, idle)


class StepOverlap:
    """The state overlapped steps carry from one submit() to the next. broadcast: the tensor-parallel
    group's (engine.tp.group.DistGroup.broadcast), None without tensor parallelism."""

    def __init__(self, device: torch.device, max_num_seqs: int, broadcast=None) -> None:
        self.device = device
        self.broadcast = broadcast
        self.cuda = device.type == "cuda"
        self.max_num_seqs = max_num_seqs
        self.clock = DeviceClock()
        self.last_sampled: torch.Tensor | None = None  # [previous step's num_sampled] int64
        self.last_sampled_rows: dict[str, int] = {}  # request id -> its row in last_sampled
        self._host_ids: list[torch.Tensor] = []
        self._host_ids_turn = 0

    def begin(self, plan: StepPlan) -> None:
        """Call at the start of submit(), before the step is built."""
        clock = self.clock
        # a new run (a fresh scheduler): the device's idle time since the last one is not this run's
        if plan.stats.step == 0:
            clock.last_end = None
            clock.last_return = None
        # NOTE: re-anchored whenever the device has nothing queued (a profiling spin counts as
        # queued): the GPU timer and the host clock drift apart (experiments/prefill_graphs/README.md)
        if self.cuda and torch.cuda.current_stream(self.device).query():
            clock.set_anchor()

    def start_event(self) -> torch.cuda.Event | None:
        """Recorded before the step's first device work (None on CPU)."""
        if not self.cuda:
            return None
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start

    def placeholders(self, plan: StepPlan, query_start_loc: np.ndarray, input_ids: np.ndarray) -> Placeholders:
        return placeholder_sources(plan, query_start_loc, input_ids, self.last_sampled_rows)

    def fill_placeholders(self, input_ids: torch.Tensor, placeholders: tuple[np.ndarray, np.ndarray],
                          staging: HostStaging) -> None:
        """Queue the copy of the previous step's sampled ids into input_ids [token rows]."""
        rows, sources = staging.upload(list(placeholders), torch.int64)
        input_ids.index_copy_(0, rows, self.last_sampled.index_select(0, sources))

    def finish(self, plan: StepPlan, sample_rows: list[int], sampled: torch.Tensor | None, started: float,
               start: torch.cuda.Event | None, on_done=None, every_rank_sampled: bool = False) -> PendingTokens:
        """Keep the step's sampled ids [num_sampled] for the next step (and send them to the other
        tensor-parallel ranks, unless each sampled the same ids itself) and return its pending result."""
        if sampled is not None and self.broadcast is not None and not every_rank_sampled:
            self.broadcast(sampled)
        self.last_sampled = sampled
        self.last_sampled_rows = {plan.scheduled[i].request_id: k for k, i in enumerate(sample_rows)} if (
            sampled is not None) else {}
        clock = self.clock
        if not self.cuda:
            pending = wall_pending(clock, started, len(plan.scheduled), sample_rows, sampled)
            pending.on_done = on_done
            return pending
        host_ids = None
        if sampled is not None:
            host_ids = self._host_ids_buffer()[: sampled.numel()]
            host_ids.copy_(sampled, non_blocking=True)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        pending = PendingTokens(len(plan.scheduled), sample_rows, host_ids, start, end, clock.last_end,
                                on_done=on_done, clock=clock)
        clock.last_end = end
        return pending

    def receive(self, num_sampled: int, sampled: torch.Tensor | None = None) -> None:
        """A tensor-parallel rank other than 0: keep the ids of the step just queued for the next
        step's placeholders: sampled, those this rank drew itself (engine.sharded_sampling), else
        rank 0's broadcast after sampling (the counterpart of finish()'s broadcast)."""
        self.last_sampled = sampled
        if num_sampled and sampled is None:
            ids = torch.empty(num_sampled, dtype=torch.int64, device=self.device)
            self.last_sampled = self.broadcast(ids)

    def _host_ids_buffer(self) -> torch.Tensor:  # pinned [max_num_seqs] int64
        # NOTE: two suffice: step N+2 is submitted only after step N's ids were read
        if not self._host_ids:
            self._host_ids = [torch.empty(self.max_num_seqs, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self._host_ids_turn ^= 1
        return self._host_ids[self._host_ids_turn]
