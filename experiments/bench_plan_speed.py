"""How fast the deployment search evaluates deployments: the issue's target is at least 200
evaluations of a 2,000-request trace in under 5 minutes on 2 cores.

The deployments are the first --evaluations of a seeded shuffle of a grid (hardware x TP x
max_num_seqs x max_num_batched_tokens x policy x router x 1-2 replicas) for Qwen3-8B on the first
2,000 requests of the Azure conversation trace. They go through harness.plan.search.evaluate_all, the
search's single evaluation call site, with a joblib map over --jobs processes plugged in there.
The row records the load average too: on a shared machine the wall time is an upper bound.

  python experiments/bench_plan_speed.py [--evaluations 200] [--jobs 2] [--out outputs/bench/plan_speed.csv]
  python experiments/bench_plan_speed.py --update-results   # rewrites the committed experiments/results/plan_speed.csv
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import shlex
import subprocess
import sys
import time
from functools import partial
from itertools import product
from pathlib import Path

import pandas as pd

from engine.core.routers import RouterConfig
from harness.parallel import parallel_map
from harness.plan.config import SLOConfig, load_catalogue
from harness.plan.search import Deployment, PlanBase, evaluate_all
from harness.scripting import compose_run_config, one_line_errors

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "experiments" / "results" / "plan_speed.csv"  # the committed row, rewritten only on request
OVERRIDES = ["experiment=plan", "workload=trace_azure_conv", "workload.rate=null", "workload.num_requests=2000",
             "output.progress=false"]
TARGET_S = 300.0


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
    parser.add_argument("--out", type=Path, default=None,
                        help="where the row goes (default: outputs/bench/plan_speed.csv, not tracked by git)")
    parser.add_argument("--update-results", action="store_true",
                        help="write the committed experiments/results/plan_speed.csv")
    args = parser.parse_args(argv)
    if args.update_results and args.out is not None:
        parser.error("--out and --update-results name two places; give one")
    args.out = RESULTS if args.update_results else args.out or Path("outputs", "bench", "plan_speed.csv")
    return one_line_errors(lambda: run(args))


def run(args) -> int:
    rc = compose_run_config(OVERRIDES)
    base = PlanBase(rc, load_catalogue(("a100", "h100", "h200")), SLOConfig(), RouterConfig())
    deployments = grid(args.evaluations)
    mapper = partial(parallel_map, backend="joblib", num_workers=args.jobs) if args.jobs > 1 else map
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    rows = evaluate_all(deployments, base, mapper)
    wall = time.perf_counter() - started
    table = pd.DataFrame(rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    row = {
        "evaluations": len(rows), "requests_per_evaluation": 2000, "jobs": args.jobs, "wall_s": round(wall, 1),
        "mean_eval_s": round(float(table["eval_s"].mean()), 2), "errors": int((table["error"] != "").sum()),
        "target_s": TARGET_S, "meets_target": wall < TARGET_S,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit.strip(),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([row]).to_csv(args.out, index=False)
    print(f"{len(rows)} evaluations of a 2,000-request trace in {wall:.1f} s on {args.jobs} processes "
          f"(target < {TARGET_S:.0f} s: {'met' if wall < TARGET_S else 'missed'}); load average "
          f"{load_before:.1f} -> {row['load_average_after']:.1f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
