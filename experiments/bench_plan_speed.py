"""How fast the deployment search evaluates deployments: the issue's target is at least 200
evaluations of a 2,000-request trace in under 5 minutes on 2 cores.

The deployments are the first --evaluations of a seeded shuffle of a grid (hardware x TP x
max_num_seqs x max_num_batched_tokens x policy x router x 1-2 replicas) for Qwen3-8B on the first
2,000 requests of the Azure conversation trace. They go through harness.plan.evaluate_all, the
search's single evaluation call site, with a joblib map over --jobs processes plugged in there.
The row records the load average too: on a shared machine the wall time is an upper bound.

  python experiments/bench_plan_speed.py [--evaluations 200] [--jobs 2] [--out experiments/results/plan_speed.csv]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one worker is one core, numpy included

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from itertools import product  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from joblib import Parallel, delayed  # noqa: E402

from engine.core.routers import RouterConfig  # noqa: E402
from harness.config import CONF_DIR, build_run_config  # noqa: E402
from harness.plan import Deployment, PlanBase, evaluate_all  # noqa: E402
from harness.plan_config import SLOConfig, load_catalogue  # noqa: E402

OVERRIDES = ["experiment=plan", "workload=trace_azure_conv", "workload.num_requests=2000", "output.progress=false"]
TARGET_S = 300.0


def grid(n: int, seed: int = 0) -> list[Deployment]:
    space = list(product(("a100", "h100", "h200"), (1, 2), (128, 256), (4096, 8192), ("nano", "mixed"),
                         ("round_robin", "least_requests", "least_tokens"), (1, 2)))
    random.Random(seed).shuffle(space)
    if n > len(space):
        raise SystemExit(f"--evaluations must be <= {len(space)}, got {n}")
    return [Deployment(*values) for values in space[:n]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "experiments" / "results" / "plan_speed.csv"))
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=OVERRIDES)
    rc = build_run_config(cfg)
    base = PlanBase(rc, load_catalogue(("a100", "h100", "h200")), SLOConfig(), RouterConfig())
    deployments = grid(args.evaluations)

    def parallel_map(fn, items):
        return Parallel(n_jobs=args.jobs)(delayed(fn)(item) for item in items)

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    rows = evaluate_all(deployments, base, parallel_map if args.jobs > 1 else map)
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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([row]).to_csv(args.out, index=False)
    print(f"{len(rows)} evaluations of a 2,000-request trace in {wall:.1f} s on {args.jobs} processes "
          f"(target < {TARGET_S:.0f} s: {'met' if wall < TARGET_S else 'missed'}); load average "
          f"{load_before:.1f} -> {row['load_average_after']:.1f}; wrote {args.out}")


if __name__ == "__main__":
    main()
