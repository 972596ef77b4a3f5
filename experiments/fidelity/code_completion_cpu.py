"""The code_completion class on the CPU, with a committed fit: where its TPOT goes and how far its
latencies move when one kind of step is priced differently. No GPU needed.

For each load (of the simulated drain's capacity) the class is simulated with the fit, then again
with every prefill step, every decode step, or every step priced a factor higher, or each step
given extra seconds of host time; the relative change of TTFT and TPOT P50/P90 says how much a
step-price error of that size moves each cell. Beside it, harness.fidelity.windows' split of the
TPOT around P50 into prefill, decode and other seconds per output token. --against NAME=PROFILE
simulates the same cells (the same rates) with another fit and reports its relative difference
(e.g. an H200's own grid fit against the H100 fit carried to it).

    python experiments/fidelity/code_completion_cpu.py --model qwen3-8b --hardware h100 \
        --profile experiments/fidelity/h100_8b/qwen3-8b_grid_fit.csv --num-blocks 1450 --num-requests 400 \
        --out experiments/fidelity/code_completion_cpu/qwen3-8b_h100.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import pandas as pd

from engine.core.graph_sizes import planned_graph_sizes
from harness.compare.study import sim_run_config
from harness.convert import ConfigError
from harness.fidelity import classes
from harness.fidelity.windows import window_row
from harness.run import run_once
from harness.scripting import compose_run_config, one_line_errors
from sim import build_sim_executor
from sim.cost_model import make_cost_model

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
# (label, prefill factor, decode factor, added seconds per step)
CHANGES = (("prefill x1.07", 1.07, 1.0, 0.0), ("decode x1.07", 1.0, 1.07, 0.0), ("all x1.07", 1.07, 1.07, 0.0),
           ("+0.5 ms a step", 1.0, 1.0, 5e-4))


class Changed:
    """A cost model whose prefill (and mixed) and decode steps are priced by factors, plus seconds."""

    def __init__(self, inner, prefill: float, decode: float, added: float) -> None:
        self.inner, self.prefill, self.decode, self.added = inner, prefill, decode, added

    def step_time(self, plan) -> float:
        factor = self.prefill if plan.stats.num_prefill_tokens else self.decode
        return self.inner.step_time(plan) * factor + self.added

    def drained(self) -> None:
        self.inner.drained()


def simulate(rc, change=(1.0, 1.0, 0.0)):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens,
                                     max_model_len=rc.scheduler.max_model_len)
        cost = Changed(make_cost_model(rc.model, rc.hardware, rc.sim, graphs), *change)
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
        return run_once(rc, False, executor=executor)


def with_profile(rc, profile: Path):
    return dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, profile_path=str(profile)))


def study(model: str, hardware: str, profile: Path, num_blocks: int, num_requests: int,
          against: dict[str, Path] | None = None) -> pd.DataFrame:
    base = compose_run_config([f"model={model}", f"hardware={hardware}", "backend=sim",
                               "scheduler.max_model_len=16384"])
    meta = {"num_blocks": num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}
    rc = sim_run_config(classes.class_run_config(base, "code_completion", num_requests, 1.0), "profiled",
                        str(profile), meta)
    rc = dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, execution=base.sim.execution))
    capacity = float(simulate(rc).summary["request_s"])
    rows = []
    for load in (0.5, 0.8, 0.95):
        cell = classes.with_rate(rc, "code_completion", load * capacity)
        point = simulate(cell)
        windows = window_row("sim", point.requests, point.steps)
        row = {"model": model, "hardware": hardware, "load": load, "rate_req_s": load * capacity,
               **{m: float(point.summary[m]) for m in METRICS},
               **{k: windows[k] for k in ("p50_tpot_prefill_s", "p50_tpot_decode_s", "p50_prefill_steps",
                                          "prefill_tokens_per_step")}}
        for label, *change in CHANGES:
            changed = simulate(cell, tuple(change)).summary
            row.update({f"{m} {label}": float(changed[m]) / row[m] - 1.0 for m in METRICS})
        for name, other in (against or {}).items():
            summary = simulate(with_profile(cell, other)).summary
            row.update({f"{m} {name}": float(summary[m]) / row[m] - 1.0 for m in METRICS})
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--profile", type=Path, required=True, help="a profiled model's coefficients")
    parser.add_argument("--num-blocks", type=int, required=True, help="the engine's KV blocks")
    parser.add_argument("--num-requests", type=int, required=True)
    parser.add_argument("--against", nargs="*", default=[], metavar="NAME=PROFILE",
                        help="other fits simulated at the same rates, reported relative to --profile")
    parser.add_argument("--out", type=Path, required=True)

    def run() -> int:
        against = {}
        for item in args.against:
            name, _, path = item.partition("=")
            if not path or not Path(path).is_file():
                raise ConfigError(f"--against {item!r}: expected NAME=PROFILE with an existing file")
            against[name] = Path(path)
        table = study(args.model, args.hardware, args.profile, args.num_blocks, args.num_requests, against)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
        print(table.set_index("load").T.to_string(float_format=lambda v: f"{v:.4g}"))
        return 0

    args = parser.parse_args(argv)
    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
