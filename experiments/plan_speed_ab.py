"""Per-evaluation time of the deployment search, this tree against another checkout, side by side.

Each deployment (the first --deployments of bench_plan_speed's grid) is evaluated by each tree in
turn, in fresh processes that alternate (baseline, this tree, baseline, ...) for --rounds rounds,
so load from other work on the machine falls on both alike. Each process reports the CPU time of
evaluate() (time.process_time: what the evaluation itself cost, less sensitive to other processes
than wall time) and its plan.csv row; in the first round it also serves the deployment again as a
plain fleet run (untimed) and reports digests of its whole requests and steps tables. Rows and
tables must be identical between trees; where they are not, the line names the fields that
differ. Prints one line per deployment (the best time of each tree) and the ratio of the summed
times; exits 1 when any result differs.

  python experiments/plan_speed_ab.py --baseline /work/main [--deployments 5] [--rounds 2] [--requests 2000]
      [--tp-sizes 1 2]

Against a baseline from before a deliberate change of the simulator's prices, the rows it
reprices differ by design; --tp-sizes keeps the deployments of those TP sizes only. The plan's
speed-up is measured against commit 0c4f729, before which nothing was repriced; since then the
steps of TP > 1 have been priced differently (the all-reduce by its measured figures, and the
ranks no longer gather the logits to sample: identical rows from commit e35a3df on), so that
comparison takes --tp-sizes 1:

  python experiments/plan_speed_ab.py --baseline <a checkout of 0c4f729> --tp-sizes 1 --deployments 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs inside each tree with only the APIs both trees have: bench_plan_speed's grid and overrides,
# harness.plan.evaluate.evaluate (harness.plan.search.evaluate in trees that keep it there), and that
# module's run_fleet_once wrapped to keep the outcome.
WORKER = """
import hashlib, json, sys, time
import pandas as pd
try:
    import harness.plan.evaluate as plan
except ImportError:
    import harness.plan.search as plan
from experiments import bench_plan_speed as bench
from engine.core.routers import RouterConfig
from harness.plan.config import SLOConfig, load_catalogue
from harness.scripting import compose_run_config

index, requests = int(sys.argv[1]), int(sys.argv[2])
overrides = [o for o in bench.OVERRIDES if not o.startswith("workload.num_requests=")]
rc = compose_run_config(overrides + [f"workload.num_requests={requests}"])
base = plan.PlanBase(rc, load_catalogue(("a100", "h100", "h200")), SLOConfig(), RouterConfig())
deployment = bench.grid(index + 1)[index]
outcomes = []
run_fleet_once = plan.run_fleet_once
plan.run_fleet_once = lambda *a, **k: outcomes.append(run_fleet_once(*a, **k)) or outcomes[-1]
started = time.process_time()
row = plan.evaluate(deployment, base)
cpu = time.process_time() - started
row.pop("eval_s")
tables, steps = {}, 0
if outcomes and sys.argv[3] == "tables":  # again, untimed, with the full tables of a plain fleet run
    import dataclasses
    from harness.fleet.config import FleetConfig
    d = deployment
    scheduler = dataclasses.replace(rc.scheduler, policy=d.policy, max_num_seqs=d.max_num_seqs,
                                    max_num_batched_tokens=d.max_num_batched_tokens)
    full = run_fleet_once(dataclasses.replace(rc, scheduler=scheduler, hardware=base.catalogue[d.hardware]),
                          FleetConfig(d.replicas, d.tp_size), RouterConfig(name=d.router), progress=False)
    digest = lambda df: hashlib.sha256(pd.util.hash_pandas_object(df, index=True).to_numpy().tobytes()).hexdigest()
    tables, steps = {"requests": digest(full.requests), "steps": digest(full.steps)}, len(full.steps)
print(json.dumps({"cpu_s": cpu, "row": row, "tables": tables, "steps": steps}, default=str))
"""


def evaluate_in(tree: Path, index: int, requests: int, tables: bool) -> dict:
    command = [sys.executable, "-c", WORKER, str(index), str(requests), "tables" if tables else "-"]
    done = subprocess.run(command, cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: deployment {index} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def grid_indices(tp_sizes: list[int] | None) -> list[int]:
    """Positions in bench_plan_speed's grid (asked of this tree, like the evaluations) of the
    deployments of these TP sizes."""
    listing = "from experiments import bench_plan_speed as b; print([d.tp_size for d in b.grid(len(b.space()))])"
    done = subprocess.run([sys.executable, "-c", listing], cwd=REPO, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    sizes = json.loads(done.stdout.strip().splitlines()[-1])
    return [i for i, tp in enumerate(sizes) if tp_sizes is None or tp in tp_sizes]


def differences(baseline: dict, this: dict) -> list[str]:
    """The row fields and tables that differ between two trees' results (NaN equals NaN)."""
    fields = sorted(set(baseline["row"]) | set(this["row"]))
    out = [f for f in fields if json.dumps(baseline["row"].get(f)) != json.dumps(this["row"].get(f))]
    return out + [f"{name} table" for name in sorted(baseline["tables"])
                  if baseline["tables"][name] != this["tables"].get(name)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="another checkout of this repository (e.g. main's)")
    parser.add_argument("--deployments", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tp-sizes", type=int, nargs="+", default=None,
                        help="only the grid's deployments of these TP sizes (default: all)")
    args = parser.parse_args(argv)
    indices = grid_indices(args.tp_sizes)
    if not indices:
        raise SystemExit(f"--tp-sizes: the grid has no deployment of TP {args.tp_sizes} (it has TP 1 and 2)")
    trees = {"baseline": Path(args.baseline).resolve(), "this": REPO}
    totals = {name: 0.0 for name in trees}
    same = True
    for index in indices[: args.deployments]:
        times: dict[str, list[float]] = {name: [] for name in trees}
        results = {}
        for round_ in range(args.rounds):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                result = evaluate_in(trees[name], index, args.requests, tables=round_ == 0)
                times[name].append(result["cpu_s"])
                results.setdefault(name, result)
        best = {name: min(ts) for name, ts in times.items()}
        for name in trees:
            totals[name] += best[name]
        differ = differences(results["baseline"], results["this"])
        same &= not differ
        print(f"deployment {index}: {results['this']['steps']} steps; baseline {best['baseline']:.2f} s, "
              f"this {best['this']:.2f} s (x{best['baseline'] / best['this']:.2f}); "
              f"rows and tables {'DIFFER: ' + ', '.join(differ) if differ else 'identical'}", flush=True)
    print(f"total (best of {args.rounds} each): baseline {totals['baseline']:.2f} s, this {totals['this']:.2f} s: "
          f"x{totals['baseline'] / totals['this']:.2f}; {'all identical' if same else 'RESULTS DIFFER'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
