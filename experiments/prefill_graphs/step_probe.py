"""Prefill steps with and without prefill CUDA graphs, on the GPU: for one-sequence prefills of
several lengths (and a mixed step), the host time of submit() (launch_s), the step's span when
submitted back to back as the async engine serves them, and its device time alone (gpu_s, device
held until the launches are queued: harness.profiling.time_plan_overlapped).

    PYTHONPATH=. python experiments/prefill_graphs/step_probe.py --ckpt /tmp/q06 --out $OUT/q06

Writes steps.csv (one row per shape and mode) and prints it.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import pandas as pd

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.executor import EngineExecutor
from harness.profiling import ProfileGrid, build_plan, time_plan_overlapped

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-blocks", type=int, default=400)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sched = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=16384, max_model_len=4096)
    grid = ProfileGrid(warmup=2, repeats=12, min_repeats=12, max_seconds_per_shape=5.0)
    rows = []
    for mode, tokens in (("graphs", 4096), ("eager", 0)):
        executor = EngineExecutor(EngineConfig(model=args.ckpt, prefill_graph_tokens=tokens), sched,
                                  CacheConfig(block_size=256, num_blocks=args.num_blocks))
        try:
            spec = executor.kv_cache_spec()
            for name, entries in SHAPES.items():
                plan = build_plan(entries, spec, sched, np.random.default_rng(0), executor.vocab_size)
                t = time_plan_overlapped(executor, plan, grid)
                rows.append({"mode": mode, "shape": name, "num_tokens": sum(n for n, _, _ in entries),
                             "span_ms": 1e3 * statistics.median(t.durations), "launch_ms": 1e3 * t.launch_s,
                             "gpu_ms": None if t.gpu_s is None else 1e3 * t.gpu_s})
        finally:
            executor.shutdown()
    df = pd.DataFrame(rows)
    df.to_csv(out / "steps.csv", index=False)
    print(df.round(2).to_string(index=False))


if __name__ == "__main__":
    main()
