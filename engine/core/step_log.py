"""A run's steps: one StepRecord per step, or a StepRun for steps booked at once.

engine.core.fast_forward books a run of decode steps of one batch without planning each; it
keeps them as a StepRun: the first step's StepStats and, per step, the three things that change
from step to step (its start, its duration and the free blocks after planning it; the step
number counts up by one). A StepLog holds both kinds in step order and reads as a sequence of
StepRecords, one per step, so that every reader sees the same steps whichever way they were
booked (harness.output.metrics builds the step table from the runs without making a record per
step).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import overload

from engine.core.plan import StepStats


@dataclass(slots=True)
class StepRecord:
    start_s: float  # when the step was planned (overlapped steps: when it began, its end less its duration)
    duration_s: float
    stats: StepStats
    idle_s: float | None = None  # overlapped steps: the device's wait for this step (StepResult.idle_s)


@dataclass(slots=True)
class StepRun:
    """num_steps consecutive steps of one batch: step k (from 0) is stats with step stats.step + k
    and num_free_blocks free_blocks[k], starting at starts[k] and lasting durations[k]."""

    stats: StepStats  # the first step's
    starts: array[float]  # ("d": 8 bytes a value, made from a list faster than a numpy array is)
    durations: array[float]
    free_blocks: array[int]  # ("q")

    @property
    def num_steps(self) -> int:
        return len(self.durations)

    @property
    def start_s(self) -> float:
        """The first step's start."""
        return self.starts[0]

    @property
    def end_s(self) -> float:
        """The last step's end."""
        return self.starts[-1] + self.durations[-1]

    def first_end_s(self) -> float:
        return self.starts[0] + self.durations[0]

    def records(self) -> Iterator[StepRecord]:
        stats = self.stats
        for k, (start, duration, free) in enumerate(zip(self.starts, self.durations, self.free_blocks)):
            yield StepRecord(start, duration, restamp(stats, stats.step + k, free))


def restamp(stats: StepStats, step: int, num_free_blocks: int, num_running: int | None = None) -> StepStats:
    """stats as another step of the same batch: dataclasses.replace() without its cost (a run
    makes one per step its records are read as)."""
    return StepStats(step, stats.kind, stats.num_requests, stats.num_prefill_tokens, stats.num_decode_tokens,
                     stats.num_waiting, stats.num_running if num_running is None else num_running, num_free_blocks,
                     stats.num_preempted, stats.prefix_hit_tokens, stats.repeated_kv_tokens,
                     stats.decode_repeated_kv_tokens)


def first_step_end(step: StepRecord | StepRun) -> float:
    """When the (first) step a hook was handed ended."""
    return step.first_end_s() if isinstance(step, StepRun) else step.start_s + step.duration_s



class StepLog:
    """Steps in order, as StepRecords and StepRuns; reads as one StepRecord per step."""

    __slots__ = ("_items", "_num_steps", "_num_runs", "_expanded")

    def __init__(self, records: Iterable[StepRecord] = ()) -> None:
        self._items: list[StepRecord | StepRun] = list(records)
        self._num_steps = len(self._items)
        self._num_runs = 0
        self._expanded: list[StepRecord] | None = None

    def append(self, record: StepRecord) -> None:
        self._items.append(record)
        self._num_steps += 1
        self._expanded = None

    def extend(self, records: Iterable[StepRecord | StepRun]) -> None:
        for item in records:
            if isinstance(item, StepRun):
                self.add_run(item)
            else:
                self.append(item)

    def add_run(self, run: StepRun) -> None:
        self._items.append(run)
        self._num_steps += run.num_steps
        self._num_runs += 1
        self._expanded = None

    @property
    def items(self) -> list[StepRecord | StepRun]:
        """The records and runs as kept (a run is one item)."""
        return self._items

    @property
    def num_runs(self) -> int:
        return self._num_runs

    def __len__(self) -> int:
        return self._num_steps

    def __bool__(self) -> bool:
        return self._num_steps > 0

    def __iter__(self) -> Iterator[StepRecord]:
        if not self._num_runs:
            return iter(self._items)  # type: ignore[arg-type]  # no runs: records only
        return self._records()

    def _records(self) -> Iterator[StepRecord]:
        for item in self._items:
            if isinstance(item, StepRun):
                yield from item.records()
            else:
                yield item

    @overload
    def __getitem__(self, index: int) -> StepRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepRecord]: ...

    def __getitem__(self, index: int | slice) -> StepRecord | list[StepRecord]:
        if self._expanded is None:
            self._expanded = list(self)
        return self._expanded[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (StepLog, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"StepLog({self._num_steps} steps, {self._num_runs} booked runs)"
