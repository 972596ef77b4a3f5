"""A measure call's cells re-simulated with the two costs of a prefill replica under load that the
simulator leaves out (experiments/disagg/h200x4_pd_mixes/run2/README.md, "The prefill replicas
under load"): how much of the TTFT miss each accounts for. A diagnostic, not a model: both figures
are measured on the engine, not derived.

    python -m experiments.disagg.prefill_whatif --run DIR [--handover-s S] [--lead-from PROFILE]
        [--label L] [resim options: --aggregated, --set OVERRIDE ...]

--handover-s: every request reaches its prefill replica S seconds after its arrival (the engine's
  router hands it to the replica's process, whose loop wakes, admits and plans it before the step's
  first device work; prefill_steps.py measures it as delay_s); its TTFT still counts from the arrival.
  Only the disaggregated fleet's prefill copies: the aggregated fleet is simulated as before.
--lead-from: the call's profile with the lead fits ("lead:<regime>") of another profile of the same
  GPU added: the host time from submit() until an idle device can run the step, which the committed
  H200 profile predates (sim.profiled_overlap).
Runs experiments.disagg.h200_run1.resim with these; writes DIR/resim_<label>.csv.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

import engine.core.disagg_fleet as disagg_fleet
from engine.core.request import Request
from experiments.disagg.h200_run1 import resim


def with_leads(profile: str, other: str, out: Path) -> Path:
    """profile's coefficients with other's lead fits in place of its own (if any), written to out."""
    base, extra = pd.read_csv(profile), pd.read_csv(other)
    leads = extra[extra["regime"].str.startswith("lead:")]
    if leads.empty:
        raise ValueError(f"--lead-from {other}: the profile has no lead fits (lead:<regime> rows)")
    pd.concat([base[~base["regime"].str.startswith("lead:")], leads]).to_csv(out, index=False)
    return out


def handed_over(copy: Callable[[Request], Request], handover_s: float) -> Callable[[Request], Request]:
    """prefill_copy, with the copy arriving at its replica handover_s after the request."""
    def late_copy(request: Request) -> Request:
        made = copy(request)
        made.arrival_time = request.arrival_time + handover_s
        return made
    return late_copy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handover-s", type=float, default=0.0)
    parser.add_argument("--lead-from", default=None)
    parser.add_argument("--label", default="whatif")
    args, rest = parser.parse_known_args(argv)
    if args.handover_s < 0:
        parser.error("--handover-s must be >= 0")
    original_copy, original_setup = disagg_fleet.prefill_copy, resim.Setup
    with tempfile.TemporaryDirectory() as scratch:
        if args.lead_from is not None:
            profile = str(with_leads(resim.PROFILE, args.lead_from, Path(scratch) / "profile.csv"))
            resim.Setup = lambda *a, **k: original_setup(*a, **{**k, "profile": profile})  # type: ignore[misc]
        disagg_fleet.prefill_copy = handed_over(original_copy, args.handover_s)
        try:
            resim.main([*rest, "--label", args.label])
        finally:
            disagg_fleet.prefill_copy, resim.Setup = original_copy, original_setup


if __name__ == "__main__":
    main()
