"""How fast the deployment search evaluates deployments: issue 35's target is 200 evaluations of a
2,000-request trace in under 60 s on 2 cores.

The deployments are the first --evaluations of a seeded shuffle of a grid (hardware x TP x
max_num_seqs x max_num_batched_tokens x policy x router x 1-2 replicas) for Qwen3-8B on the first
2,000 requests of the Azure conversation trace. They go through harness.plan.evaluate.evaluate_all, the
search's single evaluation call site, with a parallel map over --jobs processes plugged in there
(deployments that are one simulation, harness.plan.evaluate.simulation_key, are simulated once: the
row's `simulations`): parallel_map's `processes` backend (forked workers that inherit the plan's
prepared workload) in a tree that has it, else joblib's (the row's `backend`, this tree's). The
row records the load average too: on a shared machine the wall time is an upper bound.

--baseline TREE times the same evaluations with another checkout of this repository (e.g. one
from before a change) side by side: each tree in a fresh process of its own, alternating for
--rounds rounds (baseline first), the best wall time and the best CPU time of each kept; the
plan rows of the two trees must be identical (every column but eval_s), else the bench exits 1.

  python experiments/bench_plan_speed.py [--evaluations 200] [--jobs 2] [--out outputs/bench/plan_speed.csv]
  python experiments/bench_plan_speed.py --baseline ../before [--rounds 2]   # side by side
  python experiments/bench_plan_speed.py --update-results   # rewrites the committed experiments/results/plan_speed.csv
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import subprocess
import sys
from itertools import product
from pathlib import Path

import pandas as pd

from harness.plan.evaluate import simulation_key
from harness.plan.row import Deployment
from harness.scripting import one_line_errors

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "experiments" / "results" / "plan_speed.csv"  # the committed row, rewritten only on request
OVERRIDES = ["experiment=plan", "workload=trace_azure_conv", "workload.rate=null", "workload.num_requests=2000",
             "output.progress=false"]
TARGET_S, TARGET_EVALUATIONS = 60.0, 200  # fewer evaluations never meet it

# Run in each tree (a fresh process, its own code) with only what every tree since c9a06fd has: this
# bench's grid and overrides, PlanBase, evaluate_all and parallel_map's backends. Prints the wall
# time, the CPU time of this process and its workers (less sensitive to other work on the machine,
# though not immune: shared cores and caches), the backend and the plan rows as JSON.
MEASURE = """
import json, os, sys, time
from functools import partial
from experiments import bench_plan_speed as bench
from engine.core.routers import RouterConfig
from harness.parallel import BACKENDS, parallel_map
from harness.plan.config import SLOConfig, load_catalogue
try:
    from harness.plan.evaluate import PlanBase, evaluate_all
except ImportError:  # a tree that keeps them in harness.plan.search
    from harness.plan.search import PlanBase, evaluate_all
from harness.scripting import compose_run_config

n, jobs = int(sys.argv[1]), int(sys.argv[2])
rc = compose_run_config(bench.OVERRIDES)
base = PlanBase(rc, load_catalogue(("a100", "h100", "h200")), SLOConfig(), RouterConfig())
backend = "processes" if "processes" in BACKENDS else "joblib"
mapper = partial(parallel_map, backend=backend, num_workers=jobs) if jobs > 1 else map
load = os.getloadavg()[0]
cpu = lambda t: t.user + t.system + t.children_user + t.children_system
before, started = os.times(), time.perf_counter()
rows = evaluate_all(bench.grid(n), base, mapper)
wall = time.perf_counter() - started
if jobs > 1 and backend == "joblib":  # the workers' CPU time counts once they have exited
    from joblib.externals.loky import get_reusable_executor
    get_reusable_executor().shutdown(wait=True)
print(json.dumps({"wall_s": wall, "cpu_s": cpu(os.times()) - cpu(before), "load_before": load,
                  "load_after": os.getloadavg()[0], "backend": backend if jobs > 1 else "serial",
                  "rows": [dict(row) for row in rows]}, default=str))
"""


def space() -> list[tuple]:
    """Every deployment of the grid, as Deployment's fields, in a fixed order."""
    return list(product(("a100", "h100", "h200"), (1, 2), (128, 256), (4096, 8192), ("nano", "mixed"),
                        ("round_robin", "least_requests", "least_tokens"), (1, 2)))


def grid(n: int, seed: int = 0) -> list[Deployment]:
    """The first n deployments of a seeded shuffle of space()."""
    shuffled = space()
    random.Random(seed).shuffle(shuffled)
    if n > len(shuffled):
        raise SystemExit(f"--evaluations must be <= {len(shuffled)}, got {n}")
    return [Deployment(*values) for values in shuffled[:n]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout of this repository, timed side by side (default: none)")
    parser.add_argument("--rounds", type=int, default=1, help="timings of each tree; the best is kept")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the row goes (default: outputs/bench/plan_speed.csv, not tracked by git)")
    parser.add_argument("--update-results", action="store_true",
                        help="write the committed experiments/results/plan_speed.csv")
    args = parser.parse_args(argv)
    if args.update_results and args.out is not None:
        parser.error("--out and --update-results name two places; give one")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.baseline is not None and not (args.baseline / "experiments" / "bench_plan_speed.py").is_file():
        parser.error(f"--baseline {args.baseline}: not a checkout of this repository "
                     "(no experiments/bench_plan_speed.py)")
    grid(args.evaluations)  # a bad --evaluations fails here, before any timing
    args.out = RESULTS if args.update_results else args.out or Path("outputs", "bench", "plan_speed.csv")
    return one_line_errors(lambda: run(args))


def measure(tree: Path, evaluations: int, jobs: int) -> dict:
    """MEASURE run in tree: its wall time, load averages and plan rows."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(evaluations), str(jobs)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: the evaluations failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _results(rows: list[dict]) -> list[str]:
    """Each row without its timing, comparable across trees and runs (NaN equals NaN)."""
    return [json.dumps({k: v for k, v in row.items() if k != "eval_s"}) for row in rows]


def _commit(tree: Path) -> str:
    """The tree's commit, +dirty with uncommitted changes to tracked files; its path outside git."""
    done = subprocess.run(["git", "describe", "--always", "--dirty=+dirty", "--abbrev=7", "--exclude=*"], cwd=tree,
                          capture_output=True, text=True)
    return done.stdout.strip() or str(tree)


def run(args) -> int:
    trees = {"this": REPO} if args.baseline is None else {"baseline": args.baseline.resolve(), "this": REPO}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for round_ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(measure(tree, args.evaluations, args.jobs))
            last = runs[name][-1]
            print(f"round {round_ + 1}, {name}: {last['wall_s']:.1f} s ({last['cpu_s']:.1f} CPU s), load average "
                  f"{last['load_before']:.1f} -> {last['load_after']:.1f}", flush=True)
    best = {name: min(timings, key=lambda r: r["wall_s"]) for name, timings in runs.items()}
    cpu = {name: min(r["cpu_s"] for r in timings) for name, timings in runs.items()}
    reference = _results(best["this"]["rows"])
    identical = all(_results(r["rows"]) == reference for timings in runs.values() for r in timings)
    this, table = best["this"], pd.DataFrame(best["this"]["rows"])
    wall = this["wall_s"]
    row = {
        "evaluations": len(table), "simulations": len({simulation_key(d) for d in grid(args.evaluations)}),
        "requests_per_evaluation": 2000, "jobs": args.jobs, "backend": this["backend"], "wall_s": round(wall, 1),
        "cpu_s": round(cpu["this"], 1),
        "mean_eval_s": round(float(table.loc[table["eval_s"] > 0, "eval_s"].mean()), 2),
        "errors": int((table["error"] != "").sum()), "target_s": TARGET_S,
        "meets_target": len(table) >= TARGET_EVALUATIONS and wall < TARGET_S,
        "load_average_before": this["load_before"], "load_average_after": this["load_after"],
        "baseline": _commit(args.baseline) if args.baseline else "",
        "baseline_wall_s": round(best["baseline"]["wall_s"], 1) if args.baseline else float("nan"),
        "speedup": round(best["baseline"]["wall_s"] / wall, 2) if args.baseline else float("nan"),
        "baseline_cpu_s": round(cpu["baseline"], 1) if args.baseline else float("nan"),
        "cpu_speedup": round(cpu["baseline"] / cpu["this"], 2) if args.baseline else float("nan"),
        "rows_identical": identical, "rounds": args.rounds,
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _commit(REPO),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([row]).to_csv(args.out, index=False)
    against = (f"; baseline {row['baseline']} {row['baseline_wall_s']} s (x{row['speedup']}; CPU "
               f"{row['baseline_cpu_s']} s against {row['cpu_s']} s: x{row['cpu_speedup']})" if args.baseline else "")
    print(f"{len(table)} evaluations ({row['simulations']} simulations) of a 2,000-request trace in {wall:.1f} s on "
          f"{args.jobs} processes (target: {TARGET_EVALUATIONS} in < {TARGET_S:.0f} s: "
          f"{'met' if row['meets_target'] else 'missed'}){against}; "
          f"load average {row['load_average_before']:.1f} -> {row['load_average_after']:.1f}; plan rows "
          f"{'identical' if identical else 'DIFFER between runs'}; wrote {args.out}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
