"""Overlapped steps: the runner queues step N+1 on the device before step N's tokens are read.

The core plans step N+1 while step N runs (engine.core.loop), so a request that sampled in step N
decodes in step N+1 with engine.core.scheduler.PLACEHOLDER as its input token. The runner keeps
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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.core.plan import StepPlan, StepResult
from engine.core.scheduler import PLACEHOLDER


def placeholder_sources(plan: StepPlan, query_start_loc: np.ndarray, input_ids: np.ndarray,
                        previous_rows: dict[str, int]) -> tuple[np.ndarray, np.ndarray] | None:
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
        tokens = [-1] * self.num_entries
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
        if self.host_ids is not None:
            for row, token in zip(self.sample_rows, self.host_ids.tolist()):
                tokens[row] = token
        if self.on_done is not None:
            self.on_done()
        return StepResult(tokens, duration, idle, age)


def wall_pending(clock: DeviceClock, started: float, num_entries: int, sample_rows: list[int],
                 sampled: torch.Tensor | None) -> PendingTokens:
    """A CPU step, already computed: its wall times stand in for the device's."""
    now = time.perf_counter()
    idle = None if clock.last_return is None else max(0.0, started - clock.last_return)
    clock.last_return = now
    return PendingTokens(num_entries, sample_rows, sampled, None, None, None, now - started, idle)
