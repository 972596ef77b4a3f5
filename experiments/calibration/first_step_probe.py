"""Why the first step of an engine with a pinned block count is slow (0.39 s for a 0.6B prefill
that takes 0.035 s once warm, `preempt_h100.sh`): time the bench's first step shape three times
through submit(), as the engine serves it, the first one under cProfile, and print where the
host time went.

    PYTHONPATH=. python experiments/calibration/first_step_probe.py --ckpt /tmp/q06 --out $OUT/first_step
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import numpy as np

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.executor import EngineExecutor
from harness.profiling import build_plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-blocks", type=int, default=400)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sched = SchedulerConfig(max_num_seqs=512, max_num_batched_tokens=16384, max_model_len=4096)
    executor = EngineExecutor(EngineConfig(model=args.ckpt), sched, CacheConfig(block_size=256, num_blocks=args.num_blocks))
    lines = []
    try:
        spec = executor.kv_cache_spec()
        rng = np.random.default_rng(0)
        shapes = {"prefill 27 x 576": [(576, 0, False)] * 27, "decode 27": [(1, 600, True)] * 27}
        for name, entries in shapes.items():
            plan = build_plan(entries, spec, sched, rng, executor.vocab_size)
            for attempt in range(3):
                profiler = cProfile.Profile() if attempt == 0 else None
                start = time.perf_counter()
                if profiler:
                    profiler.enable()
                result = executor.submit(plan).result()
                if profiler:
                    profiler.disable()
                wall = time.perf_counter() - start
                lines.append(f"{name} #{attempt}: wall {1e3 * wall:.1f} ms, step duration {1e3 * result.duration_s:.1f} ms")
                print(lines[-1], flush=True)
                if profiler:
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
                    (out / f"{name.replace(' ', '_')}_first.txt").write_text(text.getvalue())
                    print("\n".join(text.getvalue().splitlines()[:45]), flush=True)
    finally:
        executor.shutdown()
    (out / "summary.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
