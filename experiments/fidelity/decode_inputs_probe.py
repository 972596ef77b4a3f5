"""Does a decode step cost more as the async loop serves it than as the profiling grid times it?

Served code_completion runs' small decode CUDA-graph steps took 77-93 us a step more than the grid's
price on two H200 machines, one priced by its own grid (experiments/fidelity/code_completion_h200_r5,
cause/decode_excess.py). The grid times a shape by submitting the same plan back to back, its input
ids known on the host. A served step under async scheduling differs in two ways: its decode entries'
input ids are the previous step's samples, copied in on the device (PLACEHOLDER entries,
engine.overlap.fill_placeholders), and its contexts grow by one token a step. This times decode
shapes of Qwen3-0.6B three ways, each step submitted before the previous one's result is read:

- "grid": as the profiler does (harness.calibration.profiling.time_plan_overlapped);
- "placeholders": the same plan with each decode entry's input a PLACEHOLDER, after one step that
  sampled for the same requests;
- "placeholders, growing": as "placeholders", every step's contexts one token longer (plans built
  before the timing).

    python experiments/fidelity/decode_inputs_probe.py --model qwen3-0.6b --out $OUT/decode_inputs

Writes steps.csv (every timed step's device span) and summary.txt (median span by shape and mode,
and each mode's excess over "grid").
"""

from __future__ import annotations

import dataclasses
import statistics

import pandas as pd

from engine.core.plan import PLACEHOLDER, StepPlan
from harness.calibration.profiling import time_plan_overlapped
from harness.scripting import open_probe_engine, probe_args, probe_grid, probe_parser, probe_plan

SHAPES = ((1, 2000), (4, 2000), (8, 2000), (4, 6000), (16, 2000), (32, 2000))  # (sequences, context each)
REPEATS = 60


def with_placeholders(plan: StepPlan) -> StepPlan:
    """plan with each decode entry's input token a PLACEHOLDER, as the async scheduler books it."""
    entries = [dataclasses.replace(e, token_ids=[PLACEHOLDER]) if e.is_decode else e for e in plan.scheduled]
    return dataclasses.replace(plan, scheduled=entries)


def time_served(executor, first: StepPlan, plans: list[StepPlan]) -> list[float]:
    """Device spans of plans submitted back to back, each before the previous result is read;
    first, untimed, samples the ids the first of them takes."""
    executor.submit(first).result()
    spans = []
    pending = executor.submit(plans[0])
    for following in [*plans[1:], None]:
        queued = None if following is None else executor.submit(following)
        spans.append(pending.result().duration_s)
        pending = queued
    return spans


def probe_rows(executor, sched, shapes=SHAPES, repeats: int = REPEATS) -> list[dict]:
    """One row per timed step: shape, mode and device span."""
    rows = []
    for seqs, context in shapes:
        plan = probe_plan(executor, sched, [(1, context, True)] * seqs)
        grid = time_plan_overlapped(executor, plan, probe_grid()).durations
        same = time_served(executor, plan, [with_placeholders(plan)] * repeats)
        growing = [with_placeholders(probe_plan(executor, sched, [(1, context + k, True)] * seqs))
                   for k in range(1, repeats + 1)]
        grown = time_served(executor, plan, growing)
        for mode, spans in (("grid", grid), ("placeholders", same), ("placeholders, growing", grown)):
            rows += [{"seqs": seqs, "context": context, "mode": mode, "span_s": s} for s in spans]
    return rows


def summarize(steps: pd.DataFrame) -> str:
    table = steps.groupby(["seqs", "context", "mode"])["span_s"].agg(statistics.median).unstack("mode") * 1e6
    excess = table.sub(table["grid"], axis=0).drop(columns="grid").add_suffix(" - grid")
    return ("median device span of a decode step, us\n" + table.round(1).to_string() + "\n\n"
            + excess.round(1).to_string() + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0], num_blocks=2000)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed steps per shape and mode")
    args = probe_args(parser, argv)
    executor, sched = open_probe_engine(args.ckpt, args.num_blocks, max_model_len=max(args.max_model_len, 8192))
    try:
        steps = pd.DataFrame(probe_rows(executor, sched, repeats=args.repeats))
    finally:
        executor.shutdown()
    steps.to_csv(args.out / "steps.csv", index=False)
    text = summarize(steps)
    (args.out / "summary.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
