"""Prefill steps with and without prefill CUDA graphs, on the GPU: for one-sequence prefills of
several lengths (and a mixed step), the host time of submit() (launch_s), the step's span when
submitted back to back as the async engine serves them, and its device time alone (gpu_s, device
held until the launches are queued: harness.calibration.profiling.time_plan_overlapped).

    python experiments/prefill_graphs/step_probe.py --model qwen3-0.6b --out $OUT/q06

Writes steps.csv (one row per shape and mode) and prints it.
"""

from __future__ import annotations

import statistics

import pandas as pd

from harness.calibration.profiling import time_plan_overlapped
from harness.scripting import open_probe_engine, probe_args, probe_grid, probe_parser, probe_plan

SHAPES = {  # name -> entries (new tokens, cached tokens, is_decode)
    "prefill 64": [(64, 0, False)],
    "prefill 256": [(256, 0, False)],
    "prefill 700": [(700, 0, False)],
    "prefill 1024": [(1024, 0, False)],
    "prefill 2048": [(2048, 0, False)],
    "prefill 4000": [(4000, 0, False)],
    "2 x 400 after 1024 cached": [(400, 1024, False), (400, 1024, False)],
    "mixed: 300 + 64 decodes": [(300, 0, False)] + [(1, 600, True)] * 64,
}


def main(argv: list[str] | None = None) -> None:
    args = probe_args(probe_parser(__doc__.splitlines()[0], num_blocks=400), argv)
    grid = probe_grid()
    rows = []
    for mode, tokens in (("graphs", 4096), ("eager", 0)):
        executor, sched = open_probe_engine(args.ckpt, args.num_blocks, max_model_len=args.max_model_len,
                                            prefill_graph_tokens=tokens)
        try:
            for name, entries in SHAPES.items():
                plan = probe_plan(executor, sched, entries)
                if plan is None:  # longer than max_model_len or the pinned cache
                    continue
                t = time_plan_overlapped(executor, plan, grid)
                rows.append({"mode": mode, "shape": name, "num_tokens": sum(n for n, _, _ in entries),
                             "span_ms": 1e3 * statistics.median(t.durations), "launch_ms": 1e3 * t.launch_s,
                             "gpu_ms": None if t.gpu_s is None else 1e3 * t.gpu_s})
        finally:
            executor.shutdown()
    df = pd.DataFrame(rows)
    df.to_csv(args.out / "steps.csv", index=False)
    print(df.round(2).to_string(index=False))


if __name__ == "__main__":
    main()
