"""Does a step take longer when the GPU has been busy for a while, as it is in a served run?

The profiling grid times each shape for a fraction of a second with idle gaps between shapes;
a served prefill-heavy run keeps the device busy for minutes. This times a few shapes of
Qwen3-0.6B three ways, as an overlapping engine serves them (each step submitted before the
previous one's result is read):

- "grid": as the profiler does (harness.calibration.profiling.time_plan_overlapped), before any load;
- "sustained": back to back for --seconds, every step's span and launch time kept;
- "grid after": the profiler's timing again, straight after the sustained load.

Beside it `nvidia-smi` samples the SM clock, power and temperature every 100 ms.

    python experiments/fidelity/sustained_probe.py --model qwen3-0.6b --out $OUT/sustained

Writes steps.csv (the sustained steps), grid.csv, clocks.csv, per_second.csv (per_second) and summary.txt.
"""

from __future__ import annotations

import statistics
import subprocess
import time

import pandas as pd

from harness.calibration.profiling import time_plan_overlapped
from harness.scripting import open_probe_engine, probe_args, probe_grid, probe_parser, probe_plan

SHAPES = {  # name -> entries (new tokens, cached tokens, is_decode)
    "eager prefill 6144": [(6144, 0, False)],
    # code_completion's served eager prefills: several prompts of ~2.5k tokens in one step
    "eager prefill 6 x 2560": [(2560, 0, False)] * 6,
    "graph prefill 3072": [(3072, 0, False)],
    "graph decode 128 x 1000": [(1, 1000, True)] * 128,
}
CLOCK_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu"


def sustained(executor, plan, seconds: float, start: float) -> list[dict]:
    """Steps of one shape back to back for `seconds`: each one's span on the device and launch time."""
    rows = []
    t = time.perf_counter()
    pending = executor.submit(plan)
    launch = time.perf_counter() - t
    stop = time.perf_counter() + seconds
    while True:
        more = time.perf_counter() < stop
        following, next_launch = None, None
        if more:
            t = time.perf_counter()
            following = executor.submit(plan)
            next_launch = time.perf_counter() - t
        span = pending.result().duration_s
        rows.append({"t_s": time.perf_counter() - start, "span_ms": 1e3 * span, "launch_ms": 1e3 * launch})
        if not more:
            return rows
        pending, launch = following, next_launch


def grid_row(executor, plan, grid, phase: str, name: str) -> dict:
    timing = time_plan_overlapped(executor, plan, grid)
    return {"phase": phase, "shape": name, "span_ms": 1e3 * statistics.median(timing.durations),
            "launch_ms": 1e3 * timing.launch_s, "gpu_ms": None if timing.gpu_s is None else 1e3 * timing.gpu_s}


def summarize(steps: pd.DataFrame, grid: pd.DataFrame, clocks: pd.DataFrame) -> str:
    lines = [grid.round(2).to_string(index=False), ""]
    for name, group in steps.groupby("shape", sort=False):
        n = max(1, len(group) // 10)
        first, last = group.head(n), group.tail(n)
        window = clocks[(clocks.t_s >= group.t_s.min()) & (clocks.t_s <= group.t_s.max())]
        lines.append(f"{name}: {len(group)} steps over {group.t_s.max() - group.t_s.min():.1f} s; span ms "
                     f"first tenth {first.span_ms.median():.2f}, last tenth {last.span_ms.median():.2f}, "
                     f"all {group.span_ms.median():.2f}; launch ms {group.launch_ms.median():.2f}; "
                     f"SM clock MHz median {window.sm_mhz.median():.0f} (min {window.sm_mhz.min():.0f}), "
                     f"power W median {window.power_w.median():.0f}")
    return "\n".join(lines) + "\n"


def per_second(steps: pd.DataFrame, clocks: pd.DataFrame) -> pd.DataFrame:
    """Each shape's sustained steps by whole second of its load: median span and launch, steps, and
    the SM clock, power and temperature nvidia-smi sampled in that second (how a step's time follows
    the clock as the power limit bites)."""
    tables = []
    for name, group in steps.groupby("shape", sort=False):
        second = (group.t_s - group.t_s.min()).astype(int)
        window = clocks[(clocks.t_s >= group.t_s.min()) & (clocks.t_s <= group.t_s.max())]
        clock_second = (window.t_s - group.t_s.min()).astype(int)
        table = group.groupby(second).agg(span_ms=("span_ms", "median"), launch_ms=("launch_ms", "median"),
                                          steps=("span_ms", "size"))
        table = table.join(window.groupby(clock_second).agg(sm_mhz=("sm_mhz", "median"),
                                                            power_w=("power_w", "median"), temp_c=("temp_c", "max")))
        tables.append(table.rename_axis("second").reset_index().assign(shape=name))
    return pd.concat(tables, ignore_index=True)[["shape", "second", "span_ms", "launch_ms", "steps", "sm_mhz",
                                                 "power_w", "temp_c"]]


def read_clocks(path, start_wall: float) -> pd.DataFrame:
    raw = pd.read_csv(path, header=None, names=CLOCK_FIELDS.split(","), skipinitialspace=True)
    stamps = pd.to_datetime(raw["timestamp"], format="%Y/%m/%d %H:%M:%S.%f")
    return pd.DataFrame({
        "t_s": (stamps - pd.Timestamp(0)).dt.total_seconds() - start_wall,
        "sm_mhz": raw["clocks.sm"].str.split().str[0].astype(float),
        "mem_mhz": raw["clocks.mem"].str.split().str[0].astype(float),
        "power_w": raw["power.draw"].str.split().str[0].astype(float),
        "temp_c": raw["temperature.gpu"].astype(float),
    })


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0], num_blocks=1000)
    parser.add_argument("--seconds", type=float, default=15.0, help="sustained load per shape")
    args = probe_args(parser, argv)
    args.max_model_len = max(args.max_model_len, 8192)
    grid = probe_grid()
    executor, sched = open_probe_engine(args.ckpt, args.num_blocks, max_model_len=args.max_model_len)
    raw_clocks = args.out / "nvidia_smi.csv"
    with open(raw_clocks, "w") as sink:
        sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={CLOCK_FIELDS}", "--format=csv,noheader",
                                    "-lms", "100"], stdout=sink)
    # nvidia-smi stamps local wall time without a zone; the steps meet it through this one anchor
    start, start_wall = time.perf_counter(), (pd.Timestamp.now() - pd.Timestamp(0)).total_seconds()
    grid_rows, steps = [], []
    try:
        plans = {name: probe_plan(executor, sched, entries) for name, entries in SHAPES.items()}
        for name, plan in plans.items():
            grid_rows.append(grid_row(executor, plan, grid, "grid", name))
        for name, plan in plans.items():
            steps += [dict(shape=name, **row) for row in sustained(executor, plan, args.seconds, start)]
            grid_rows.append(grid_row(executor, plan, grid, "grid after", name))
            time.sleep(2.0)  # let the clocks settle between shapes, as the grid's gaps do
    finally:
        sampler.terminate()
        executor.shutdown()
    steps_df, grid_df = pd.DataFrame(steps), pd.DataFrame(grid_rows)
    clocks = read_clocks(raw_clocks, start_wall)
    steps_df.to_csv(args.out / "steps.csv", index=False)
    grid_df.to_csv(args.out / "grid.csv", index=False)
    clocks.to_csv(args.out / "clocks.csv", index=False)
    per_second(steps_df, clocks).round(2).to_csv(args.out / "per_second.csv", index=False)
    text = summarize(steps_df, grid_df, clocks)
    (args.out / "summary.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
