"""How fast the simulator runs, on one core, with fast-forward and without, side by side.

  (a) the whole Azure conversation trace (19,366 requests, real arrival times), Qwen3-8B on an
      H100, nano policy, max_model_len 16384 (the trace's longest request is 14,050 + decode
      tokens): target under 30 s, and at least 3x fewer seconds with fast-forward than without;
  (b) nano-vllm's bench (256 offline requests, lengths uniform in [100, 1024]), Qwen3-0.6B on an
      H100: target under 2 s;
  (c) the decode-heavy class (500 Poisson requests at 2 req/s, prompts uniform in [800, 1200], outputs
      in [1400, 1800]), Qwen3-8B on an H100: at least 10x fewer seconds with fast-forward;
  (d) a simulated day with autoscaling (about 10^5 requests on a periodic rate profile, Qwen3-8B on
      H100s, autoscale.policy=utilisation): `python -m harness ...` end to end in a child process
      (imports, outputs and plot included), fast-forward on: target under 60 s.

--fast-forward both (the default) runs each of (a)-(c) with backend.fast_forward=true and =false,
after an untimed run of 16 requests each (lazy imports, first calls), alternating (on, off, on,
off, ...) so that a change in the machine's load falls on both, and
checks that the two give identical requests, steps and summary tables (the summary less its
wall_s). The day (d) runs with fast-forward on only (tests/harness/test_autoscale.py checks an
autoscaled run's outputs are identical without it).

Each of (a)-(c) is timed in-process through harness.run.run_once, as `python -m harness` runs it
(build the executor and the requests, drive the core loop, tabulate requests and steps), without
writing files or plots, pinned to one CPU core. Seconds are CPU seconds of the process (what the
run costs, whatever else the machine runs) and wall seconds beside them; the median over repeats
is reported and the speedup is the ratio of the CPU medians. The core loop's time (the run's
wall_s) is reported beside the rest (set-up and tables). --profile adds a cProfile run of each
case and splits its time between the scheduler core (engine/core), the simulator (sim/), the
harness and the rest (numpy, pandas, ...), charging built-ins to the module that called them.

  python experiments/bench_sim_speed.py [--repeats 3] [--profile] [--out outputs/bench/sim_speed.csv]
  python experiments/bench_sim_speed.py --repeats 3 --profile --update-results   # the committed results

It times the library Python imports: the installed one, unless PYTHONPATH=. puts the checkout's
first (a git worktree beside an editable install of another checkout needs it).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core means one core, numpy included
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import resource  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from harness.config import REPO_ROOT  # noqa: E402
from harness.run import run_once  # noqa: E402
from harness.scripting import compose_run_config  # noqa: E402

# case -> (overrides, target seconds, target speedup of fast-forward or None)
CASES = {
    "azure_conv_qwen3_8b_h100": (
        ["model=qwen3-8b", "hardware=h100", "workload=trace_azure_conv", "scheduler.max_model_len=16384"], 30.0, 3.0),
    "nano_bench_qwen3_0_6b_h100": (["model=qwen3-0.6b", "hardware=h100", "experiment=bench"], 2.0, None),
    # the decode-heavy class: prompts about 1,000 tokens, outputs about 1,600, Poisson arrivals
    "decode_heavy_qwen3_8b_h100": (
        ["model=qwen3-8b", "hardware=h100", "workload=poisson", "workload.num_requests=500", "workload.rate=2",
         "workload.prompt_len.low=800", "workload.prompt_len.high=1200", "workload.output_len.low=1400",
         "workload.output_len.high=1800", "scheduler.max_model_len=4096"], 30.0, 10.0),
}
# a day of about 10^5 requests, autoscaled (docs/autoscaling.md): run as a command, end to end
DAY = "autoscale_day_qwen3_8b_h100"
DAY_OVERRIDES = ["model=qwen3-8b", "workload=poisson",
                 "workload.rate_profile=[[0,0.4],[21600,1.2],[36000,2.0],[57600,1.5],[72000,0.7]]",
                 "workload.rate_period_s=86400", "fleet.replicas=1", "autoscale.policy=utilisation",
                 "autoscale.max_replicas=8", "output.progress=false", "output.steps=none"]
DAY_TARGET_S = 60.0
RESULTS = REPO_ROOT / "experiments" / "results" / "sim_speed.csv"  # committed, rewritten only on request
COMPONENTS = (("engine/core/", "core scheduler"), ("/sim/", "simulator"), ("/harness/", "harness"))


def time_case(overrides: list[str], tables: dict | None = None) -> dict:
    rc = compose_run_config(overrides)
    t0, c0 = time.perf_counter(), time.process_time()
    outcome = run_once(rc, progress=False, record=False)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    loop = outcome.summary["wall_s"]
    if tables is not None:
        summary = {k: v for k, v in outcome.summary.to_row().items() if k != "wall_s"}
        tables.update(requests=outcome.requests, steps=outcome.steps, summary=pd.DataFrame([summary]))
    return {
        "requests": len(outcome.requests), "steps": len(outcome.steps),
        "simulated_makespan_s": outcome.summary["makespan_s"], "output_tok_s": outcome.summary["output_tok_s"],
        "loop_s": loop, "setup_and_tables_s": total - loop, "total_s": total, "cpu_s": cpu,
    }


def time_day(overrides: list[str]) -> dict:
    """`python -m harness <overrides>` in a child process on this process's core: its CPU seconds
    (user and system) and wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-m", "harness", *overrides, f"hydra.run.dir={out}"], cwd=REPO_ROOT,
                       check=True, capture_output=True, text=True)
    total = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"total_s": total, "cpu_s": cpu, "loop_s": float("nan"), "setup_and_tables_s": float("nan")}


def profile_case(overrides: list[str]) -> dict[str, float]:
    profiler = cProfile.Profile()
    profiler.runcall(time_case, overrides)
    stats = pstats.Stats(profiler).stats
    by_component: dict[str, float] = {}

    def component(func) -> str:
        filename = func[0].replace("\\", "/")
        for marker, name in COMPONENTS:
            if marker in filename:
                return name
        return "other (numpy, pandas, hydra, stdlib)"

    for func, (_, _, tottime, _, callers) in stats.items():
        if func[0] == "~" and callers:
            # A built-in (len, list.append, xxhash...): charge it to whoever called it.
            for caller, entry in callers.items():
                name = component(caller)
                by_component[name] = by_component.get(name, 0.0) + entry[2]
        else:
            by_component[component(func)] = by_component.get(component(func), 0.0) + tottime
    return by_component


def device() -> str:
    model = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, 1 of {os.cpu_count()} cores, Python {platform.python_version()}"


def load() -> str:
    """The machine's load averages (1, 5, 15 min) when the case was timed: other work on it."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else ""


def check_identical(case: str, on: dict, off: dict) -> None:
    """Fast-forward's tables against the step-by-step path's: identical, value for value."""
    for table in ("requests", "steps", "summary"):
        pd.testing.assert_frame_equal(on[table], off[table], check_exact=True, obj=f"{case} {table}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 101), metavar="1..100")
    parser.add_argument("--profile", action="store_true", help="also split the time by component (cProfile)")
    parser.add_argument("--cases", nargs="+", default=[*CASES, DAY], choices=[*CASES, DAY])
    parser.add_argument("--fast-forward", choices=("both", "on", "off"), default="both",
                        help="backend.fast_forward: both times each case with it on and off, alternating")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the rows go, and the split beside it as <stem>_profile.csv "
                             "(default: outputs/bench/sim_speed.csv, not tracked by git)")
    parser.add_argument("--update-results", action="store_true",
                        help="write the committed experiments/results/sim_speed.csv (and its _profile.csv)")
    args = parser.parse_args(argv)
    if args.update_results and args.out is not None:
        parser.error("--out and --update-results name two places; give one")
    args.out = RESULTS if args.update_results else args.out or Path("outputs", "bench", "sim_speed.csv")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                            text=True).stdout.strip()
    common = {
        "device": device(), "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit,
        "command": " ".join(["python experiments/bench_sim_speed.py",
                             *map(shlex.quote, sys.argv[1:] if argv is None else argv)]),
    }
    rows, profile_rows = [], []
    modes = {"both": ("on", "off"), "on": ("on",), "off": ("off",)}[args.fast_forward]
    for case in args.cases:
        rows += time_day_case(args.repeats, common) if case == DAY else \
            time_sim_case(case, modes, args.repeats, common)
        if args.profile and case != DAY:
            for mode in modes:
                split = profile_case([*CASES[case][0], f"backend.fast_forward={'true' if mode == 'on' else 'false'}"])
                total = sum(split.values())
                for name, seconds in sorted(split.items(), key=lambda kv: -kv[1]):
                    profile_rows.append({"case": case, "fast_forward": mode, "component": name, "seconds": seconds,
                                         "share": seconds / total, **common})
                    print(f"    {mode}: {name:38s} {seconds:7.2f} s  {100 * seconds / total:5.1f}% (under cProfile)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.4g")
    if profile_rows:
        pd.DataFrame(profile_rows).to_csv(args.out.with_name(args.out.stem + "_profile.csv"), index=False,
                                          float_format="%.4g")
    print(f"wrote {args.out}")
    return 0


def time_sim_case(case: str, modes: tuple[str, ...], repeats: int, common: dict) -> list[dict]:
    """Each mode `repeats` times, alternating; a row per mode (medians) with the speedup."""
    case_overrides, target, target_speedup = CASES[case]
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    tables: dict[str, dict] = {mode: {} for mode in modes}
    for mode in modes:  # untimed: the first run in a process pays for lazy imports and first calls
        time_case([*case_overrides, "workload.num_requests=16", f"backend.fast_forward={mode == 'on'}".lower()])
    loads = []
    for _ in range(repeats):
        for mode in modes:
            loads.append(load())
            overrides = [*case_overrides, f"backend.fast_forward={'true' if mode == 'on' else 'false'}"]
            runs[mode].append(time_case(overrides, tables[mode]))
    rows = []
    for mode in modes:
        timed = runs[mode]
        best = min(timed, key=lambda r: r["cpu_s"])
        row = {"case": case, "fast_forward": mode,
               "overrides": " ".join([*case_overrides, f"backend.fast_forward={mode == 'on'}".lower()]), **best,
               "cpu_median_s": statistics.median(r["cpu_s"] for r in timed),
               "total_median_s": statistics.median(r["total_s"] for r in timed), "repeats": repeats,
               "target_s": target, "load_average": "; ".join(loads), **common}
        row["meets_target"] = row["cpu_median_s"] < target
        rows.append(row)
        print(f"{case} (fast-forward {mode}): {row['requests']} requests, {row['steps']} steps, simulated "
              f"{row['simulated_makespan_s']:.1f} s; CPU median {row['cpu_median_s']:.2f} s, wall median "
              f"{row['total_median_s']:.2f} s (loop {best['loop_s']:.2f}, set-up and tables "
              f"{best['setup_and_tables_s']:.2f}); target < {target:g} s: {'met' if row['meets_target'] else 'MISSED'}")
    if len(modes) == 2:
        if all(tables.values()):
            check_identical(case, tables["on"], tables["off"])
        on, off = rows
        speedup = off["cpu_median_s"] / on["cpu_median_s"]
        for row in rows:
            row["speedup"] = speedup
            row["speedup_wall"] = off["total_median_s"] / on["total_median_s"]
            row["target_speedup"] = target_speedup
            row["meets_speedup"] = speedup >= target_speedup if target_speedup else None
        verdict = f"target >= {target_speedup:g}x: {'met' if speedup >= target_speedup else 'MISSED'}" \
            if target_speedup else "no speedup target"
        print(f"{case}: fast-forward {speedup:.1f}x fewer CPU seconds ({on['speedup_wall']:.1f}x wall), "
              f"identical requests, steps and summary tables; {verdict}")
    return rows


def time_day_case(repeats: int, common: dict) -> list[dict]:
    """The autoscaled day as a command, fast-forward on, `repeats` times: one row (medians)."""
    loads, timed = [], []
    for _ in range(repeats):
        loads.append(load())
        timed.append(time_day(DAY_OVERRIDES))
    row = {"case": DAY, "fast_forward": "on", "overrides": " ".join(DAY_OVERRIDES),
           **min(timed, key=lambda r: r["cpu_s"]),
           "cpu_median_s": statistics.median(r["cpu_s"] for r in timed),
           "total_median_s": statistics.median(r["total_s"] for r in timed), "repeats": repeats,
           "target_s": DAY_TARGET_S, "load_average": "; ".join(loads), **common}
    row["meets_target"] = row["cpu_median_s"] < DAY_TARGET_S
    print(f"{DAY} (python -m harness, fast-forward on): CPU median {row['cpu_median_s']:.1f} s, wall median "
          f"{row['total_median_s']:.1f} s; target < {DAY_TARGET_S:g} s: {'met' if row['meets_target'] else 'MISSED'}")
    return [row]


if __name__ == "__main__":
    raise SystemExit(main())
