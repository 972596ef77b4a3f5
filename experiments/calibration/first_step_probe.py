"""Why the first step of an engine with a pinned block count is slow (0.39 s for a 0.6B prefill
that takes 0.035 s once warm, `preempt_h100.sh`): time the bench's first step shape three times
through submit(), as the engine serves it, the first one under cProfile, and print where the
host time went.

    python experiments/calibration/first_step_probe.py --model qwen3-0.6b --out $OUT/first_step
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

from harness.scripting import open_probe_engine, probe_args, probe_parser, probe_plan

SHAPES = {"prefill 27 x 576": [(576, 0, False)] * 27, "decode 27": [(1, 600, True)] * 27}


def main(argv: list[str] | None = None) -> None:
    args = probe_args(probe_parser(__doc__.splitlines()[0], num_blocks=400), argv)
    executor, sched = open_probe_engine(args.ckpt, args.num_blocks, max_num_seqs=512,
                                        max_model_len=args.max_model_len)
    lines = []
    try:
        for name, entries in SHAPES.items():
            plan = probe_plan(executor, sched, entries)
            for attempt in range(3):
                profiler = cProfile.Profile() if attempt == 0 else None
                start = time.perf_counter()
                if profiler:
                    profiler.enable()
                result = executor.submit(plan).result()
                if profiler:
                    profiler.disable()
                wall = time.perf_counter() - start
                lines.append(f"{name} #{attempt}: wall {1e3 * wall:.1f} ms, "
                             f"step duration {1e3 * result.duration_s:.1f} ms")
                print(lines[-1], flush=True)
                if profiler:
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
                    (args.out / f"{name.replace(' ', '_')}_first.txt").write_text(text.getvalue())
                    print("\n".join(text.getvalue().splitlines()[:45]), flush=True)
    finally:
        executor.shutdown()
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
