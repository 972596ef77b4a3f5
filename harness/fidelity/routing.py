"""A mixture-of-experts model in the held-out protocol: the routing skew the simulations price with,
and the profile's distinct-experts column.

The skew is fidelity.moe_routing_skew where given; else measured: the engine counts the tokens its
routers sent to each expert while it serves the profiling grid (backend.record_expert_counts=true:
engine.expert_counts), the counts go to expert_counts.csv in the run directory and
sim.moe.fit_routing_skew turns them into the skew; without counts, uniform routing (0). The grid's
random token ids are drawn like the classes' (harness.calibration.grid, harness.workloads), so the
grid routes as the classes do. The skew reaches every simulated cell through the engine's run
metadata (harness.compare.study.sim_run_config reads meta["moe_routing_skew"]).

The profile's moe_distinct_experts column is what the profiled model fits an expert's price on
(sim.profiled): the distinct experts per MoE layer each shape's step really touched, where the
engine recorded them (harness.calibration.expert_steps), else the expectation of its token count
under that skew (sim.moe.ExpertRouting), as the simulator computes it for a simulated step (a
column the fit cannot separate from the size: sim.piecewise.collinear). A profile that already
has the column keeps it. moe_expected_experts holds the expectation beside it, for comparing the
two; the fit does not read it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from sim.features import EXPECTED_EXPERTS, MOE_FEATURES

log = logging.getLogger(__name__)


def measured_skew(given: float | None, counts, model, out_dir: Path) -> float:
    """The routing skew of a run (module docstring); counts: an engine.expert_counts.ExpertCounts or None."""
    if not model.is_moe:
        return 0.0
    if given is not None:
        log.info("routing skew %.3f (fidelity.moe_routing_skew)", given)
        return float(given)
    if counts is None or counts.tokens.sum() == 0:
        log.info("routing skew 0 (uniform): the engine recorded no expert counts "
                 "(backend.record_expert_counts=true measures it)")
        return 0.0
    from sim.moe import fit_routing_skew

    counts.frame().to_csv(out_dir / "expert_counts.csv", index=False)
    skew = fit_routing_skew(counts.tokens, model.num_experts_per_tok)
    log.info("routing skew %.3f, fitted to the expert counts of the profiling grid (%s)", skew,
             out_dir / "expert_counts.csv")
    return skew


def with_distinct_experts(table: pd.DataFrame, model, skew: float) -> pd.DataFrame:
    """table with the MoE column where the model has experts and the table lacks it, and the
    expectation beside it (module docstring)."""
    if not model.is_moe or EXPECTED_EXPERTS in table.columns:
        return table
    from sim.moe import ExpertRouting

    routing = ExpertRouting(model.num_experts, model.num_experts_per_tok, skew)
    expected = [routing.distinct(int(n)) for n in table["num_tokens"]]
    table = table.assign(**{EXPECTED_EXPERTS: expected})
    if all(f in table.columns for f in MOE_FEATURES):
        return table
    return table.assign(moe_distinct_experts=expected)
