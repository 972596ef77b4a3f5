"""Fit a device call's profiling grid again, on the CPU, as the held-out protocol fits it
(harness.fidelity.calibrate.calibrated_model: harness.calibration.fit.validate on the grid alone): for a
fit that changed after the call. Writes profile_model.csv (with the residuals the prediction
interval resamples) and validation.csv into --out, for resimulate.py.

    python experiments/fidelity/refit_profile.py experiments/fidelity/h100_30b/profile.csv.gz \
        --out experiments/fidelity/h100_30b/refit

--experts expected fits an MoE grid that recorded each step's distinct experts
(harness.calibration.expert_steps) on the expectation beside them (moe_expected_experts) instead,
as a grid without per-step counts was fitted: the fit then prices steps with the quantity the
simulator gives a served step. With --moe-routing-locality (and --model, --moe-routing-skew) that
expectation is first computed again from each row's sequences at that skew and locality
(harness.fidelity.routing.expected_experts), as the protocol computes it when it fits a locality.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

from harness.calibration.fit import validate
from harness.convert import ConfigError
from harness.fidelity.routing import SharedRouting, expected_experts
from harness.scripting import compose_run_config, one_line_errors
from sim.features import EXPECTED_EXPERTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="a call's profile.csv (the grid's measured steps)")
    parser.add_argument("--out", type=Path, required=True, help="folder for profile_model.csv and validation.csv")
    parser.add_argument("--experts", choices=("measured", "expected"), default="measured",
                        help="an MoE grid's distinct-experts column: as recorded, or the expectation beside it")
    parser.add_argument("--moe-routing-locality", type=float, default=None,
                        help="with --experts expected: the expectation at this locality (sim.moe_locality)")
    parser.add_argument("--moe-routing-skew", type=float, default=0.0, help="the skew the call fitted (its log)")
    parser.add_argument("--moe-routing-shared-prefix", action="store_true",
                        help="with --moe-routing-locality: sequences over one prefix as routing groups "
                             "(the profile's moe_routing_groups: experiments/fidelity/routing_groups.py)")
    parser.add_argument("--moe-routing-shared-fresh", type=float, default=None,
                        help="with --moe-routing-shared-prefix: how alike a group's members route "
                             "(sim.moe_shared_prefix; none: the group as one sequence)")
    parser.add_argument("--moe-routing-shared-cap", type=int, default=None,
                        help="with --moe-routing-shared-fresh: the routings a group's later members choose among")
    parser.add_argument("--model", default=None, help="conf/model name (with --moe-routing-locality)")
    args = parser.parse_args(argv)

    def run() -> int:
        table = pd.read_csv(args.profile)
        if "duration_s" not in table.columns or "set" not in table.columns:
            raise ConfigError(f"profile: {args.profile} is not a profiling grid's table (needs duration_s and set)")
        if args.experts == "expected":
            if EXPECTED_EXPERTS not in table.columns:
                raise ConfigError(f"--experts expected: {args.profile} has no {EXPECTED_EXPERTS} column "
                                  "(a grid of an MoE model with per-step counts has)")
            if args.moe_routing_locality is not None:
                if args.model is None:
                    raise ConfigError("--moe-routing-locality needs --model (its experts and top-k)")
                model = compose_run_config([f"model={args.model}"]).model
                shared = SharedRouting(args.moe_routing_shared_prefix, args.moe_routing_shared_fresh,
                                       args.moe_routing_shared_cap)
                table = table.assign(**{EXPECTED_EXPERTS: expected_experts(
                    table, model, args.moe_routing_skew, args.moe_routing_locality, shared)})
            table = table.assign(moe_distinct_experts=table[EXPECTED_EXPERTS])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, validation = validate(table, None)
        args.out.mkdir(parents=True, exist_ok=True)
        model.to_csv(args.out / "profile_model.csv")
        validation.to_csv(args.out / "validation.csv", index=False)
        print(validation.round(3).to_string(index=False))
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
