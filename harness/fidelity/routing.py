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

The routing locality (sim.moe_locality: how alike one sequence's tokens route) is
fidelity.moe_routing_locality where given; else fitted (sim.moe_locality.fit_routing_locality, the
skew held at its own value) to the grid rows whose counts the engine recorded and whose sequences
attend to KV of their own (locality_rows); else 0, independent tokens as before. The expectation
beside the counts is then of each row's sequences (sim.features.row_sequences) at the skew and
locality: what a simulated step of that shape is priced with.

Sequences that start with the same tokens (fidelity.moe_routing_shared_prefix) form routing groups
(sim.features.routing_sequences) where given true; else, with the grid's routing groups
(ROUTING_GROUPS, written beside the counts), where the grid's shared-prefix rows' counts are
explained better grouped (smaller squared log error) than with every sequence on its own; else
false. How alike a group's members route (fidelity.moe_routing_shared_fresh and _cap,
sim.moe_shared_prefix) is fitted to the same rows, the skew and locality held, unless given; the
rows are the grid's shared-prefix steps without a cached prefill context (as for the locality:
chunks after a context the grid filled with whatever the pool held route as no served chunk does).
The expectation beside the counts then groups them too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sim.features import EXPECTED_EXPERTS, MOE_FEATURES, ROUTING_GROUPS, row_routing_sequences, row_sequences

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


# Grid kinds whose sequences' counts the locality is fitted to: each sequence's KV is its own. Left
# out: rows with a cached context (the grid fills it with whatever the pool's blocks hold, not the
# sequence's own KV: chunks after it route as no served chunk does) and the shared_* kinds
# (sequences over one prefix route alike, a correlation across sequences the model leaves out).
LOCALITY_KINDS = ("prefill", "decode", "mixed", "long_prefill")


def locality_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The grid rows the locality is fitted to (LOCALITY_KINDS, no cached prefill context)."""
    keep = (table["set"] == "grid") & table["kind"].isin(LOCALITY_KINDS) & (table["prefill_context_tokens"] == 0)
    return table[keep]


def measured_locality(given: float | None, table: pd.DataFrame, model, skew: float) -> float:
    """The routing locality of a run (module docstring); table: the profiling grid's rows."""
    if not model.is_moe:
        return 0.0
    if given is not None:
        log.info("routing locality %.3f (fidelity.moe_routing_locality)", given)
        return float(given)
    if EXPECTED_EXPERTS not in table.columns or "moe_distinct_experts" not in table.columns:
        log.info("routing locality 0 (independent tokens): the grid has no per-step expert counts")
        return 0.0
    from sim.moe_locality import fit_routing_locality

    rows = locality_rows(table)
    steps = [row_sequences(p, d, s) for p, d, s in
             zip(rows["num_prefill_tokens"], rows["num_decode_tokens"], rows["num_seqs"], strict=True)]
    locality = fit_routing_locality(steps, rows["moe_distinct_experts"], model.num_experts,
                                    model.num_experts_per_tok, skew)
    log.info("routing locality %.3f, fitted to the distinct experts of %d grid steps", locality, len(rows))
    return locality


def table_sequences(table: pd.DataFrame, shared_prefix: bool = False) -> list[list[int] | list[tuple[int, ...]]]:
    """Each row's new tokens per (routing) sequence: sim.features.row_sequences, or with
    shared_prefix and the table's ROUTING_GROUPS, row_routing_sequences."""
    columns = table["num_prefill_tokens"], table["num_decode_tokens"], table["num_seqs"]
    if shared_prefix:
        if ROUTING_GROUPS not in table.columns:
            raise ValueError(f"shared-prefix routing needs the table's {ROUTING_GROUPS} column (the profiler writes "
                             "it beside per-step expert counts)")
        return [row_routing_sequences(p, d, s, g) for p, d, s, g in
                zip(*columns, table[ROUTING_GROUPS], strict=True)]
    return [row_sequences(p, d, s) for p, d, s in zip(*columns, strict=True)]


@dataclass(frozen=True)
class SharedRouting:
    """A run's shared-prefix routing (module docstring; sim.config.SimConfig's fields of that name)."""

    on: bool = False
    fresh: float | None = None
    cap: int | None = None

    def meta(self) -> dict[str, float | bool | None]:
        """The run metadata a simulated cell reads it from (harness.compare.study.sim_run_config)."""
        return {"moe_routing_shared_prefix": self.on, "moe_routing_shared_fresh": self.fresh if self.on else None,
                "moe_routing_shared_cap": self.cap if self.on else None}


def shared_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The grid rows shared-prefix routing is decided and fitted on (module docstring)."""
    from harness.calibration.grid import SHARED_KINDS

    if "kind" not in table.columns:
        return table[:0]
    keep = (table["set"] == "grid") & table["kind"].isin(SHARED_KINDS) & (table["prefill_context_tokens"] == 0)
    return table[keep]


def measured_shared_prefix(given: bool | None, table: pd.DataFrame, model, skew: float, locality: float,
                           fresh: float | None = None, cap: int | None = None) -> SharedRouting:
    """A run's shared-prefix routing (module docstring); fresh and cap: as given (None: fitted)."""
    if not model.is_moe or given is False:
        return SharedRouting()
    rows = shared_rows(table)
    measured = ROUTING_GROUPS in table.columns and "moe_distinct_experts" in table.columns and len(rows) > 0
    if measured and fresh is None:
        from sim.moe_shared_prefix import fit_shared_routing

        try:
            fresh, cap = fit_shared_routing(table_sequences(rows, True), rows["moe_distinct_experts"],
                                            model.num_experts, model.num_experts_per_tok, skew, locality)
        except ValueError:  # no row groups two sequences: nothing to fit
            measured = False
        else:
            log.info("shared-prefix routing: a later member's draw fresh for its group %.3g, the group's routings "
                     "%s, fitted to %d grid steps", fresh, "unbounded" if cap is None else cap, len(rows))
    if given:
        log.info("shared-prefix routing on (fidelity.moe_routing_shared_prefix)")
        return SharedRouting(True, fresh, cap)
    if not measured:
        log.info("shared-prefix routing off: it needs the grid's shared-prefix rows with counts and routing groups")
        return SharedRouting()
    from sim.moe_locality import SequenceRouting, squared_log_error

    routing = SequenceRouting(model.num_experts, model.num_experts_per_tok, skew, locality, fresh, cap)
    observed = rows["moe_distinct_experts"].to_numpy(dtype=float)
    apart, grouped = (squared_log_error(routing, table_sequences(rows, shared), observed) for shared in (False, True))
    log.info("shared-prefix routing %s: squared log error of %d shared-prefix grid steps %.3g grouped, %.3g apart",
             "on" if grouped < apart else "off", len(rows), grouped, apart)
    return SharedRouting(bool(grouped < apart), fresh, cap)


def expected_experts(table: pd.DataFrame, model, skew: float, locality: float = 0.0,
                     shared: SharedRouting = SharedRouting()) -> list[float]:
    """The expected distinct experts of each row's (routing) sequences at the skew and locality."""
    from sim.moe import ExpertRouting
    from sim.moe_locality import SequenceRouting

    # the token count alone (a table may have no other column)
    if locality == 0.0 and (not shared.on or shared.fresh is None):
        independent = ExpertRouting(model.num_experts, model.num_experts_per_tok, skew)
        return [independent.distinct(int(n)) for n in table["num_tokens"]]
    routing = SequenceRouting(model.num_experts, model.num_experts_per_tok, skew, locality,
                              shared.fresh if shared.on else None, shared.cap if shared.on else None)
    return [routing.distinct(sizes) for sizes in table_sequences(table, shared.on)]


def with_distinct_experts(table: pd.DataFrame, model, skew: float, locality: float = 0.0,
                          shared: SharedRouting = SharedRouting()) -> pd.DataFrame:
    """table with the MoE column where the model has experts and the table lacks it, and the
    expectation beside it (module docstring); a table with the expectation gets it again at a
    nonzero locality."""
    if not model.is_moe or (EXPECTED_EXPERTS in table.columns and locality == 0.0 and not shared.on):
        return table
    table = table.assign(**{EXPECTED_EXPERTS: expected_experts(table, model, skew, locality, shared)})
    if all(f in table.columns for f in MOE_FEATURES):
        return table
    return table.assign(moe_distinct_experts=table[EXPECTED_EXPERTS])
