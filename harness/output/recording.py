"""Per-step records beyond StepStats: the step's features, a fingerprint of its schedule, and on a
wall clock the host time the loop spent around it.

StepRecorder is a StepHook (engine.core.executor): register it with executor.observe() and hand
the core loop the clock that watch() returns. The executor calls it once per step, in step order,
so row i of frame() is step i of RunResult.steps.

Columns:
- sim.features.FEATURE_COLUMNS of the plan (graphs: the CUDA-graph sizes the backend replays,
  BackendInfo.graph_sizes, so the features say which steps replayed a graph);
- schedule_hash: a digest of (request id, first position, new tokens, sample) per scheduled entry
  and the preempted ids. Two runs made the same decisions at step i iff their hashes agree;
- host_s (wall clock only): time since the previous execute() returned (update, admissions,
  this step's schedule), less the time the clock slept waiting for an arrival, plus what this
  execute() took beyond the duration the executor reported. So on a wall clock
  sum(duration + host_s) + time asleep = the time the last execute() returned.
  With overlapped steps (submit()), host_s is the executor's idle_s, the time the device waited
  for the step after the previous one ended, less the sleep in that gap: the host time that was
  not hidden behind the device; and launch_s, the host time of the submit() call (building,
  uploading and launching the step), which sim.profiled fits the launch time of eager steps on;
  and loop_s, the host time from the previous submit()'s return to this submit()'s call, less the
  sleep in that gap: the loop's own work between launches (reading a result, update, admissions,
  the schedule, this recorder's row, and whatever else the loop does per step, e.g. a server's
  hand-off), which bounds the step period from below where the device waits for the host;
- slept_s (wall clock only): the time the loop slept waiting for an arrival before the step. The
  loop sleeps only with no step in flight, so a step with slept_s > 0 found the device idle and
  paid its whole lead, as a simulated step after cost_model.drained() does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd
import xxhash

from engine.core.executor import StepTiming
from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan, StepResult
from sim.features import FEATURE_COLUMNS, as_graph_sizes, step_features


def schedule_hash(plan: StepPlan) -> str:
    digest = xxhash.xxh64()
    for e in plan.scheduled:
        digest.update(f"{e.request_id}:{e.num_computed_tokens}:{len(e.token_ids)}:{int(e.sample)};".encode())
    digest.update(("|" + ",".join(plan.preempted_ids)).encode())
    return digest.hexdigest()


class _RecordingClock:
    def __init__(self, inner, recorder: StepRecorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def now(self) -> float:
        return self._inner.now()

    def advance(self, duration_s: float) -> None:
        self._inner.advance(duration_s)

    def wait_until(self, t: float) -> None:
        start = time.perf_counter()
        self._inner.wait_until(t)
        self._recorder.asleep_s += time.perf_counter() - start


class StepRecorder:
    """A StepHook that keeps one row per step (FEATURE_COLUMNS, schedule hash, host_s, launch_s,
    slept_s, loop_s).

    The loop only sleeps while no step is in flight, so the sleep since the previous row always
    lies before the call of this row's step: that is what host_s leaves out."""

    def __init__(self, graphs: GraphSizes | Sequence[int] = (), wall: bool = False) -> None:
        self.graphs = as_graph_sizes(graphs)
        self.wall = wall
        self.rows: list[tuple] = []
        self.asleep_s = 0.0
        self._last_return = time.perf_counter()
        self._asleep_at_last_row = 0.0

    def watch(self, clock):
        """The clock to hand to engine.core.loop.run in place of `clock`. Call it right before
        run(): the first step's host time counts from here."""
        self._last_return = time.perf_counter()
        self._asleep_at_last_row = self.asleep_s
        return _RecordingClock(clock, self)

    def __call__(self, plan: StepPlan, result: StepResult, timing: StepTiming) -> None:
        asleep = self.asleep_s - self._asleep_at_last_row
        host = launch = loop = None
        if timing.overlapped:
            launch = timing.returned_s - timing.called_s
            if self.wall:
                # the device's idle gap before the step, less the loop's sleep for arrivals in it
                host = max(0.0, (result.idle_s or 0.0) - asleep)
                loop = max(0.0, timing.called_s - self._last_return - asleep)
        elif self.wall:
            gap = timing.called_s - self._last_return - asleep
            host = gap + (timing.returned_s - timing.called_s - result.duration_s)
        # NOTE: the row is ints and one string, which the garbage collector stops tracking; keeping
        # the plans instead made its full passes long (0.2-0.4 s stalls on the engine's clock).
        # Building it counts as host time of the next step, like the rest of the loop.
        slept = asleep if self.wall else None
        self.rows.append((*step_features(plan, self.graphs).values(), schedule_hash(plan), host, launch, slept, loop))
        self._last_return = timing.returned_s
        self._asleep_at_last_row = self.asleep_s

    def frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.rows, columns=[*FEATURE_COLUMNS, "schedule_hash", "host_s", "launch_s", "slept_s",
                                                 "loop_s"])
        if not self.wall:
            frame = frame.drop(columns=["host_s", "slept_s"])
        if frame["launch_s"].isna().all():  # steps not overlapped: nothing was launched ahead
            frame = frame.drop(columns=["launch_s"])
        if frame["loop_s"].isna().all():  # not overlapped, or not on a wall clock
            frame = frame.drop(columns=["loop_s"])
        return frame
