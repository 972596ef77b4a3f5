"""How fast the simulator runs: the issue's targets, measured on one core.

  (a) the whole Azure conversation trace (19,366 requests, real arrival times), Qwen3-8B on an
      H100, nano policy, max_model_len 16384 (the trace's longest request is 14,050 + decode
      tokens): target under 30 s;
  (b) nano-vllm's bench (256 offline requests, lengths uniform in [100, 1024]), Qwen3-0.6B on an
      H100: target under 2 s;
  (c) the decode-heavy class (500 Poisson requests at 2 req/s, prompts uniform in [800, 1200], outputs
      in [1400, 1800]), Qwen3-8B on an H100.

--fast-forward both (the default) times each case with backend.fast_forward=true and =false side by
side (engine.core.fast_forward) and checks that both give the same requests and steps tables.

Each case is timed end to end in-process through harness.run.run_once, as `python -m harness`
runs it (build the executor and the requests, drive the core loop, tabulate requests and steps),
without writing files or plots, pinned to one CPU core. The core loop's time (the run's wall_s)
is reported beside the rest (set-up and tables). --profile adds a cProfile run of
each case and splits its time between the scheduler core (engine/core), the simulator (sim/), the
harness and the rest (numpy, pandas, ...), charging built-ins to the module that called them.

  python experiments/bench_sim_speed.py [--repeats 3] [--profile] [--out outputs/bench/sim_speed.csv]
  python experiments/bench_sim_speed.py --repeats 3 --profile --update-results   # the committed results
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
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402

from harness.config import REPO_ROOT  # noqa: E402
from harness.run import run_once  # noqa: E402
from harness.scripting import compose_run_config  # noqa: E402

CASES = {
    "azure_conv_qwen3_8b_h100": (
        ["model=qwen3-8b", "hardware=h100", "workload=trace_azure_conv", "scheduler.max_model_len=16384"], 30.0),
    "nano_bench_qwen3_0_6b_h100": (["model=qwen3-0.6b", "hardware=h100", "experiment=bench"], 2.0),
    # the decode-heavy class: prompts about 1,000 tokens, outputs about 1,600, Poisson arrivals
    "decode_heavy_qwen3_8b_h100": (
        ["model=qwen3-8b", "hardware=h100", "workload=poisson", "workload.num_requests=500", "workload.rate=2",
         "workload.prompt_len.low=800", "workload.prompt_len.high=1200", "workload.output_len.low=1400",
         "workload.output_len.high=1800", "scheduler.max_model_len=4096"], 30.0),
}
RESULTS = REPO_ROOT / "experiments" / "results" / "sim_speed.csv"  # committed, rewritten only on request
COMPONENTS = (("engine/core/", "core scheduler"), ("/sim/", "simulator"), ("/harness/", "harness"))


def time_case(overrides: list[str], tables: dict | None = None) -> dict:
    rc = compose_run_config(overrides)
    t0 = time.perf_counter()
    outcome = run_once(rc, progress=False, record=False)
    total = time.perf_counter() - t0
    loop = outcome.summary["wall_s"]
    if tables is not None:
        tables["requests"], tables["steps"] = outcome.requests, outcome.steps
    return {
        "requests": len(outcome.requests), "steps": len(outcome.steps),
        "simulated_makespan_s": outcome.summary["makespan_s"], "output_tok_s": outcome.summary["output_tok_s"],
        "loop_s": loop, "setup_and_tables_s": total - loop, "total_s": total,
    }


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, 101), metavar="1..100")
    parser.add_argument("--profile", action="store_true", help="also split the time by component (cProfile)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--fast-forward", choices=("both", "on", "off"), default="both",
                        help="backend.fast_forward: both times each case with it on and off")
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
        case_overrides, target = CASES[case]
        outputs: dict[str, dict] = {}
        for mode in modes:
            overrides = [*case_overrides, f"backend.fast_forward={'true' if mode == 'on' else 'false'}"]
            outputs[mode] = {}
            runs = [time_case(overrides, outputs[mode]) for _ in range(args.repeats)]
            totals = [r["total_s"] for r in runs]
            best = min(runs, key=lambda r: r["total_s"])
            row = {"case": case, "fast_forward": mode, "overrides": " ".join(overrides), **best,
                   "total_median_s": statistics.median(totals), "repeats": args.repeats, "target_s": target,
                   "meets_target": statistics.median(totals) < target, **common}
            rows.append(row)
            print(f"{case} (fast-forward {mode}): {row['requests']} requests, {row['steps']} steps, "
                  f"simulated {row['simulated_makespan_s']:.1f} s; "
                  f"wall min {min(totals):.2f} s, median {row['total_median_s']:.2f} s "
                  f"(loop {best['loop_s']:.2f}, set-up and tables {best['setup_and_tables_s']:.2f}); "
                  f"target < {target:g} s: {'met' if row['meets_target'] else 'MISSED'}")
            if args.profile:
                split = profile_case(overrides)
                total = sum(split.values())
                for name, seconds in sorted(split.items(), key=lambda kv: -kv[1]):
                    profile_rows.append({"case": case, "fast_forward": mode, "component": name, "seconds": seconds,
                                         "share": seconds / total, **common})
                    print(f"    {name:38s} {seconds:7.2f} s  {100 * seconds / total:5.1f}% (under cProfile)")
        if len(outputs) == 2:
            for table in ("requests", "steps") if all(outputs.values()) else ():
                pd.testing.assert_frame_equal(outputs["on"][table], outputs["off"][table], check_exact=True)
            on, off = (next(r for r in rows if r["case"] == case and r["fast_forward"] == m) for m in ("on", "off"))
            speedup = off["total_median_s"] / on["total_median_s"]
            on["speedup"] = off["speedup"] = speedup
            print(f"{case}: fast-forward {speedup:.1f}x fewer seconds, identical requests and steps tables")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.4g")
    if profile_rows:
        pd.DataFrame(profile_rows).to_csv(args.out.with_name(args.out.stem + "_profile.csv"), index=False,
                                          float_format="%.4g")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
