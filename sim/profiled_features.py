"""Features the profiled cost model (sim.profiled) adds to a step before its fits price it: what the
decode kernel's longest programs add to a decode-only step (sim.decode_programs), the prefill
kernel's program term of a prefill step (sim.prefill_programs; of a planned step, a table's rows,
or a tool's own step features that lack it), and, for a step table that lacks them, a
mixture-of-experts model's expected distinct experts (sim.features.MOE_FEATURES).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan
from sim.decode_programs import PROGRAM_EXCESS, DecodePrograms, launch_graph, plan_lens
from sim.features import MOE_FEATURES, ROUTING_GROUPS, DistinctExperts, row_read_sequences
from sim.piecewise import PiecewiseLinearFit
from sim.prefill_programs import (
    PREFILL_CACHED_KV_BYTES,
    PREFILL_PROGRAM_KEYS,
    PREFILL_TERMS,
    ROW_KEY_FEATURES,
    PrefillPrograms,
)
from sim.profiled_regimes import FALLBACK, regime_of


def with_program_excess(features: dict[str, float], plan: StepPlan, ahead: int, programs: DecodePrograms | None,
                        fits: Mapping[str, PiecewiseLinearFit], graphs: GraphSizes) -> dict[str, float]:
    """features, with what the decode kernel's longest programs add to a decode-only step
    (sim.decode_programs), its contexts `ahead` tokens longer than plan's; features as they are
    without programs or where they do not apply."""
    if programs is None or features["num_prefill_tokens"] or not features["num_decode_tokens"] \
            or not programs.applies(len(plan.scheduled)):  # most steps: no per-sequence work
        return features
    used = fits[next(r for r in FALLBACK[regime_of(features)] if r in fits)]
    per_token = dict(zip(used.linear_features, used.linear_coefs)).get("decode_context_tokens", 0.0)
    # a graph launches with the split count it was captured with (sim.decode_programs)
    graph = launch_graph(features, graphs.decode_context)
    features[PROGRAM_EXCESS] = programs.step_excess_s(plan_lens(plan, ahead), per_token, graph)
    return features


def with_prefill_programs(features: dict[str, float], plan: StepPlan, programs: PrefillPrograms) -> dict[str, float]:
    """features, with the prefill kernel's program term of the step and its cached context's K/V
    bytes (sim.prefill_programs; 0 for a decode-only step)."""
    keys = programs.plan_keys(plan, bool(features["cuda_graph"])) if features["num_prefill_tokens"] else 0.0
    features.update(programs.terms(features, keys))
    return features


def programs_if_used(used: bool, programs: PrefillPrograms | None, where: str,
                     kv_used: bool = False) -> PrefillPrograms | None:
    """programs where a profile's fits price the prefill program term or the cached K/V bytes
    (used; kv_used: the bytes; ValueError without what they need), else None."""
    if used and programs is None:
        raise ValueError(f"{where}: fitted with the prefill kernel's programs ({', '.join(PREFILL_TERMS)}); pricing "
                         "it needs the model's and GPU's shapes (hardware.prefill_programs_per_sm)")
    if kv_used and programs is not None and not programs.kv_bytes_per_token:
        raise ValueError(f"{where}: fitted with {PREFILL_CACHED_KV_BYTES}; pricing it needs the model's K/V bytes a "
                         "token (PrefillPrograms.kv_bytes_per_token)")
    return programs if used else None


def with_prefill_column(rows: list[dict[str, Any]], programs: PrefillPrograms | None) -> list[dict[str, Any]]:
    """A step table's rows with the prefill program term of each (sim.prefill_programs: from the
    row's totals, PrefillPrograms.row_keys)."""
    assert programs is not None  # programs_if_used refuses a profile that prices the term without them
    return [{**row, **programs.terms(row, keys)} for row, keys in zip(rows, programs.column(rows))]


def with_row_programs(features: Mapping[str, float], fits: Mapping[str, PiecewiseLinearFit],
                      programs: PrefillPrograms | None) -> Mapping[str, float]:
    """features, with the prefill program term from the step's totals (PrefillPrograms.row_keys, as
    a table's rows are priced) where a fit prices it and features lack it: a step a tool built
    itself (experiments' step pricing) priced like a simulated one. ValueError where it cannot be."""
    used = {term for fit in fits.values() for term in PREFILL_TERMS if term in fit.linear_features}
    if used <= set(features):
        return features
    kernel = programs_if_used(True, programs, "this profile", PREFILL_CACHED_KV_BYTES in used)
    assert kernel is not None  # programs_if_used refuses a missing kernel
    missing = [name for name in ROW_KEY_FEATURES if name not in features]
    if missing:
        raise ValueError(f"this profile prices the prefill kernel's programs ({PREFILL_PROGRAM_KEYS}), which needs "
                         f"the step's {missing} (or its own {PREFILL_PROGRAM_KEYS}); the step features lack them")
    return {**features, **kernel.terms(features, kernel.row_keys(features))}


def with_expected_experts(df: pd.DataFrame, uses_moe_features: bool, distinct: DistinctExperts | None,
                          shared_prefix_routing: bool) -> pd.DataFrame:
    """df with the MoE column where the fits price it (uses_moe_features) and the table lacks it (a
    served run's steps: the engine reads its expert counter back only for the profiling grid),
    filled with the expected count of each step's sequences and graph padding
    (sim.features.row_read_sequences), as the model prices a simulated step."""
    if all(name in df.columns for name in MOE_FEATURES) or not uses_moe_features:
        return df
    if distinct is None:
        raise ValueError(f"the step table lacks {list(MOE_FEATURES)} and this mixture-of-experts profile has no "
                         "routing to derive it from (sim.cost_model.make_cost_model sets distinct_experts)")
    shared = shared_prefix_routing and ROUTING_GROUPS in df.columns
    expected = [distinct(row_read_sequences(row, shared)) for row in df.to_dict("records")]
    return df.assign(**{name: expected for name in MOE_FEATURES})
