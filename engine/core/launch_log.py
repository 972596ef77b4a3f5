"""What a fleet replica's process records of its steps' launches, for sim.host_speed to read the
serving host's speed off (measured_host_scale: decode graph steps' launch_s against the profile's
launch fit).

LaunchLog is a StepHook (engine.core.executor): registered with executor.observe(), it keeps per
overlapped step (submit()) a LaunchRow:

  step                    StepStats.step, which joins the row to the replica's step table
  launch_s                the host time of the submit() call (harness.output.recording's launch_s)
  graph_batch_size        the decode graph the step replayed (its padded batch); 0 for any other
                          step (prefill or mixed, eager or too large for the largest graph)
  decode_context_tokens   a decode graph step's context (sim.features.step_features'), else 0
  decode_repeated_tokens  a decode graph step's StepStats.decode_repeated_kv_tokens, else 0

The launch fit of a decode graph also reads num_seeded: the served workloads carry no per-request
seed (harness.workloads.source), so it is not recorded (0).

NOTE: it runs once per step in a host-bound loop: a few attribute reads, and for a decode graph
step one sum over its entries; no feature dict, no hash. A step that did not overlap (execute(),
or a backend that cannot overlap) has no launch of its own to time and keeps no row.
"""

from __future__ import annotations

from bisect import bisect_left

from engine.core.executor import StepTiming
from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan, StepResult

LaunchRow = tuple[int, float, int, int, int]
LAUNCH_COLUMNS = ("step", "launch_s", "graph_batch_size", "decode_context_tokens", "decode_repeated_tokens")


class LaunchLog:
    """A StepHook keeping a LaunchRow per overlapped step; take() hands them over."""

    __slots__ = ("rows", "_decode")

    def __init__(self, graphs: GraphSizes) -> None:
        self.rows: list[LaunchRow] = []
        self._decode = graphs.decode

    def __call__(self, plan: StepPlan, result: StepResult, timing: StepTiming) -> None:
        if not timing.overlapped:
            return
        stats = plan.stats
        launch = timing.returned_s - timing.called_s
        sizes = self._decode
        n = stats.num_requests
        if stats.num_prefill_tokens or not plan.use_cuda_graphs or not sizes or n > sizes[-1]:
            self.rows.append((stats.step, launch, 0, 0, 0))
            return
        # a decode entry computes one token: its context is what it had computed, plus that one
        context = sum(e.num_computed_tokens for e in plan.scheduled) + stats.num_decode_tokens
        self.rows.append((stats.step, launch, sizes[bisect_left(sizes, n)], context,
                          stats.decode_repeated_kv_tokens))

    def take(self) -> list[LaunchRow]:
        rows, self.rows = self.rows, []
        return rows
