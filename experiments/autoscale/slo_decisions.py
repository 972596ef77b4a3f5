"""The slo policy's decisions, one row per evaluation: what it saw (replicas serving and starting,
the window's P90, the arrival rate, the longest queue and the rate its replica is sent, a
replica's capacity, the replicas the demand needs) and what it asked for, with the drain time
it estimated (the modelled one and the one it decided on: docs/autoscaling.md, "A miss that a
queue explains"). It runs the workload once, as `python -m harness` would with the same overrides,
at the start-up --startup-s (the cold-start study's pricing: that many seconds in all) or, without
it, the configured one. Writes the rows as CSV and prints the run's attainment and cost.

    python -m experiments.autoscale.slo_decisions --startup-s 600 --out /tmp/decisions.csv \\
        model=qwen3-32b workload=trace_azure_conv scheduler.max_model_len=8192 fleet.replicas=2 \\
        slo.ttft_p90_s=2 autoscale.policy=slo autoscale.slo_target=0.5 autoscale.slo_scale_down_below=0.2
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.elastic import ColdStart, FleetSignal
from harness.autoscale.demand import drain_s
from harness.autoscale.policies import SLOFeedback, make_policy
from harness.autoscale.run import run_autoscaled
from harness.scripting import compose_config, one_line_errors


class Watched:
    """The configured slo policy, each decision recorded."""

    def __init__(self, policy: SLOFeedback) -> None:
        self.policy = policy
        self.rows: list[dict] = []

    def desired(self, signal: FleetSignal) -> int:
        sizing = self.policy.sizing
        sizing.estimate = None  # set again only where this decision estimates a drain
        want = self.policy.desired(signal)
        values = signal.ttfts + signal.waiting_ages if self.policy.metric == "ttft" else signal.tpots
        capacity = sizing.demand.capacity(signal)
        holder = max(signal.serving, key=lambda r: r.backlog, default=None)
        self.rows.append({
            "time_s": signal.now, "serving": len(signal.serving), "starting": signal.starting,
            "p90_s": float(np.percentile(values, self.policy.percentile)) if values else math.nan,
            "arrival_rate": signal.arrival_rate, "longest_queue": holder.backlog if holder else 0,
            "its_arrival_rate": holder.arrival_rate if holder else None, "capacity": capacity,
            "needed": sizing.demand.needed(signal),
            "modelled_drain_s": drain_s(signal, capacity) if capacity and holder and holder.backlog else None,
            "drain_s": sizing.estimate, "startup_s": signal.startup_s, "desired": want})
        return want


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--startup-s", type=float, default=None, help="a new replica's start-up, s (default: priced)")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m harness")
    args = parser.parse_args(argv)
    if args.startup_s is not None and not args.startup_s >= 0:
        parser.error(f"--startup-s must be >= 0 (seconds), got {args.startup_s}")
    from harness.autoscale.config import build_autoscale
    from harness.config import build_run_config
    from harness.convert import ConfigError
    from harness.fleet.config import build_fleet

    cfg = compose_config(args.overrides)
    autoscale, slo = build_autoscale(cfg)
    if autoscale.policy != "slo":
        raise ConfigError(f"slo_decisions records the slo policy: set autoscale.policy=slo (got {autoscale.policy})")
    policy = make_policy(autoscale, slo)
    assert isinstance(policy, SLOFeedback)
    watched = Watched(policy)
    fleet, router = build_fleet(cfg)
    cold = ColdStart(provision_s=args.startup_s) if args.startup_s is not None else None
    outcome = run_autoscaled(build_run_config(cfg), fleet, router, autoscale, slo, bool(cfg.output.progress), cold,
                             policy=watched)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(watched.rows).to_csv(args.out, index=False)
    row = outcome.summary.to_row()
    print(f"SLO attainment {row['slo_attainment']:.3f}, cost ${row['cost']:.2f}, {row['scale_ups']} scale-ups; "
          f"{len(watched.rows)} decisions in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(one_line_errors(main))
