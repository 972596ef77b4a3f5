"""The harness's own runs of the benchmark's cases, one loaded engine for all of them.

    python -m experiments.serve.harness_runs PLAN.json

PLAN.json lists {"overrides": [...], "out": "folder"}; the engine is built from the first case's
config (the cases differ only in their workload) and each case is a `python -m harness` run of its
overrides (harness.run.run_once: a fresh scheduler, the same engine), written to its folder. One
process, so the engine's start-up (weights, memory profile, CUDA graphs) is paid once; the
benchmark runs it as a child, so the GPU's memory is free again for the servers when it exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.run import make_executor, run_once, write_outcome
from harness.scripting import compose_run_config
from harness.shared_executor import KeepAlive


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path, help='JSON list of {"overrides": [...], "out": "folder"}')
    args = parser.parse_args(argv)
    if not args.plan.is_file():
        parser.error(f"no such plan file: {args.plan}")
    plan = json.loads(args.plan.read_text())
    configs = [compose_run_config(case["overrides"]) for case in plan]
    started = time.perf_counter()
    executor = make_executor(configs[0])
    print(f"harness runs: engine built in {time.perf_counter() - started:.0f} s", flush=True)
    try:
        for case, rc in zip(plan, configs):
            began = time.perf_counter()
            outcome = run_once(rc, progress=False, executor=KeepAlive(executor))
            write_outcome(outcome, Path(case["out"]), plots=False)
            print(f"harness run {case['out']}: {outcome.summary.num_requests} requests in "
                  f"{time.perf_counter() - began:.0f} s", flush=True)
    finally:
        executor.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
