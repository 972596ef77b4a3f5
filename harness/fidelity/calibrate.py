"""The held-out protocol's calibration (harness.fidelity.study): the profiled model fitted on the
profiling grid alone (profiled here, or a given table or saved coefficients), with an MoE model's
routing measured on the same grid (harness.fidelity.routing)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tqdm import tqdm

from harness.config import RunConfig
from harness.fidelity import routing

if TYPE_CHECKING:
    from harness.fidelity.study import FidelityConfig


def calibrated_model(executor, rc: RunConfig, fc: FidelityConfig,
                     out_dir: Path) -> tuple[str, dict[str, float | bool | None]]:
    """A model file with residuals, fitted on the profiling grid alone, and the routing of an MoE
    model (harness.fidelity.routing: moe_routing_skew, moe_routing_locality and the shared-prefix
    routing's fields; 0 and off for a dense one)."""
    from harness.calibration.fit import validate
    from harness.calibration.profiling import ExpertTally, ProfileGrid, profile_executor
    graphs = executor.info().graph_sizes
    counts = None
    if fc.profile_path is not None:
        table = pd.read_csv(fc.profile_path)
        if "duration_s" not in table.columns:  # saved coefficients: their residuals, if any, are used as saved
            skew = routing.measured_skew(fc.moe_routing_skew, None, rc.model, out_dir)
            shared = routing.SharedRouting(bool(fc.moe_routing_shared_prefix), fc.moe_routing_shared_fresh,
                                           fc.moe_routing_shared_cap)
            return fc.profile_path, {"moe_routing_skew": skew, "moe_routing_locality": fc.moe_routing_locality or 0.0,
                                     **shared.meta()}
    else:
        grid = ProfileGrid.quick() if fc.grid == "quick" else ProfileGrid()
        bar = tqdm(desc="profile", unit="shape", leave=False)
        # an MoE engine that records its routing: each row's distinct experts as measured, the
        # grid's counts in all for the skew (start-up's steps are not the grid's: dropped)
        experts = ExpertTally.of(executor)
        table = profile_executor(executor, rc.scheduler, grid, progress=lambda n, row: bar.update(1),
                                 experts=experts)
        bar.close()
        counts = experts.total if experts is not None else None
    skew = routing.measured_skew(fc.moe_routing_skew, counts, rc.model, out_dir)
    locality = routing.measured_locality(fc.moe_routing_locality, table, rc.model, skew)
    shared = routing.measured_shared_prefix(fc.moe_routing_shared_prefix, table, rc.model, skew, locality,
                                            fc.moe_routing_shared_fresh, fc.moe_routing_shared_cap)
    table = routing.with_distinct_experts(table, rc.model, skew, locality, shared)
    if fc.profile_path is None:
        table.to_csv(out_dir / "profile.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, validation = validate(table, None, graphs)
    validation.to_csv(out_dir / "validation.csv", index=False)
    model.to_csv(out_dir / "profile_model.csv")
    return str(out_dir / "profile_model.csv"), {"moe_routing_skew": skew, "moe_routing_locality": locality,
                                                **shared.meta()}
