"""Per-step records beyond StepStats: the step's features, a fingerprint of its schedule, and on a
wall clock the host time the loop spent around it.

StepRecorder wraps the executor and the clock handed to the core loop. The loop calls execute()
exactly once per StepRecord it appends, so row i of frame() is step i of RunResult.steps.

Columns:
- sim.features.FEATURE_COLUMNS of the plan (graphs: the CUDA-graph sizes the backend captured,
  so the features say which steps replayed a graph);
- schedule_hash: a digest of (request id, first position, new tokens, sample) per scheduled entry
  and the preempted ids. Two runs made the same decisions at step i iff their hashes agree;
- host_s (wall clock only): time since the previous execute() returned (update, admissions,
  this step's schedule), less the time the clock slept waiting for an arrival, plus what this
  execute() took beyond the duration the executor reported. So on a wall clock
  sum(duration + host_s) + time asleep = the time the last execute() returned.
  With overlapped steps (submit()), host_s is the executor's idle_s, the time the device waited
  for the step after the previous one ended, less the sleep in that gap: the host time that was
  not hidden behind the device; and launch_s, the host time of the submit() call (building,
  uploading and launching the step), which sim.profiled fits the launch time of eager steps on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd
import xxhash

from engine.core.plan import KVCacheSpec, StepPlan, StepResult
from sim.features import FEATURE_COLUMNS, GraphSizes, as_graph_sizes, step_features


def schedule_hash(plan: StepPlan) -> str:
    digest = xxhash.xxh64()
    for e in plan.scheduled:
        digest.update(f"{e.request_id}:{e.num_computed_tokens}:{len(e.token_ids)}:{int(e.sample)};".encode())
    digest.update(("|" + ",".join(plan.preempted_ids)).encode())
    return digest.hexdigest()


def graph_sizes_of(executor, rc) -> GraphSizes:
    """The steps that run as CUDA graphs: what the engine captured, or what the simulator's config
    says it would."""
    if rc.backend == "sim":
        return rc.sim.graph_sizes(rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens)
    runner = getattr(executor, "runner", None)

    def captured(graphs) -> tuple[int, ...]:
        # graphs built with capture=False (CPU) run eagerly: no graph is replayed
        return tuple(graphs.sizes) if graphs is not None and getattr(graphs, "captured", True) else ()

    return GraphSizes(captured(getattr(runner, "graphs", None)), captured(getattr(runner, "prefill_graphs", None)))


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


class _RecordingExecutor:
    def __init__(self, inner, recorder: StepRecorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def __getattr__(self, name: str):
        # eos_token_id, vocab_size, runner, ...: the wrapped executor's
        return getattr(self._inner, name)

    def kv_cache_spec(self) -> KVCacheSpec:
        return self._inner.kv_cache_spec()

    def execute(self, plan: StepPlan) -> StepResult:
        rec = self._recorder
        entered = time.perf_counter()
        result = self._inner.execute(plan)
        left = time.perf_counter()
        # NOTE: the row is built now and the plan let go: keeping every step's entries alive for the
        # whole run made the garbage collector's full passes long (0.2-0.4 s stalls on the engine's
        # clock). A row is ints and one string, which the collector stops tracking. Building it
        # counts as host time of the next step, like the rest of the loop.
        host = None
        if rec.wall:
            gap = entered - rec._last_exit - (rec.asleep_s - rec._asleep_at_exit)
            host = gap + (left - entered - result.duration_s)
        rec.rows.append((*step_features(plan, rec.graphs).values(), schedule_hash(plan), host, None))
        rec._last_exit = left
        rec._asleep_at_exit = rec.asleep_s
        return result

    def submit(self, plan: StepPlan):
        """Overlapped steps: the row is built now, its host_s filled in when the result is read."""
        rec = self._recorder
        asleep_before = rec.asleep_s - rec._asleep_at_exit
        submitted = time.perf_counter()
        pending = self._inner.submit(plan)
        launch = time.perf_counter() - submitted
        rec.rows.append((*step_features(plan, rec.graphs).values(), schedule_hash(plan), None, launch))
        return _RecordedPending(pending, rec, len(rec.rows) - 1, asleep_before)

    def shutdown(self) -> None:
        self._inner.shutdown()


class _RecordedPending:
    def __init__(self, inner, recorder: StepRecorder, row: int, asleep_s: float) -> None:
        self._inner = inner
        self._recorder = recorder
        self._row = row
        self._asleep_s = asleep_s

    def result(self) -> StepResult:
        rec = self._recorder
        result = self._inner.result()
        if rec.wall:
            # the device's idle gap before the step, less the loop's sleep for arrivals in it
            host = max(0.0, (result.idle_s or 0.0) - self._asleep_s)
            rec.rows[self._row] = (*rec.rows[self._row][:-2], host, rec.rows[self._row][-1])
        rec._asleep_at_exit = rec.asleep_s
        return result


class StepRecorder:
    def __init__(self, graphs: GraphSizes | Sequence[int] = (), wall: bool = False) -> None:
        self.graphs = as_graph_sizes(graphs)
        self.wall = wall
        self.rows: list[tuple] = []  # FEATURE_COLUMNS values, schedule hash, host time
        self.asleep_s = 0.0
        self._last_exit = time.perf_counter()
        self._asleep_at_exit = 0.0

    def wrap(self, executor, clock):
        """(executor, clock) to hand to engine.core.loop.run in place of the originals. Call it
        right before run(): the first step's host time counts from here."""
        self._last_exit = time.perf_counter()
        self._asleep_at_exit = self.asleep_s
        return _RecordingExecutor(executor, self), _RecordingClock(clock, self)

    def frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.rows, columns=[*FEATURE_COLUMNS, "schedule_hash", "host_s", "launch_s"])
        if not self.wall:
            frame = frame.drop(columns=["host_s"])
        if frame["launch_s"].isna().all():  # steps not overlapped: nothing was launched ahead
            frame = frame.drop(columns=["launch_s"])
        return frame
