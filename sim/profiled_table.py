"""Profiled cost model, a step-timing table priced row by row (ProfiledCostModel.predict)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from sim.profiled_features import programs_if_used, with_expected_experts, with_prefill_column
from sim.profiled_overlap import behind_itself
from sim.step_table import complete_columns

if TYPE_CHECKING:
    from sim.profiled import ProfiledCostModel


def predict_table(model: ProfiledCostModel, df: pd.DataFrame, include_host: bool = False) -> np.ndarray:
    """Predicted duration_s for each row of a step-timing table; with include_host, plus the
    host time (the whole loop step, what step_time() returns). With a previous_duration_s
    column and an overlapping profile, eager and prefill graph steps are priced after their
    measured predecessor; a row without one as the grid measured it, behind a repeat of itself."""
    df = complete_columns(df.assign(duration_s=1.0)) if "duration_s" not in df else complete_columns(df)
    # a served run's table may lack the MoE column: filled as step_time() prices a simulated step
    rows = with_expected_experts(df, model.uses_moe_features, model.distinct_experts,
                                 model.shared_prefix_routing).to_dict("records")
    if model.uses_prefill_programs:
        rows = with_prefill_column(rows, programs_if_used(True, model.prefill_programs, "this profile"))
    predicted = np.array([model.predict_features(row) for row in rows])
    if model.prices_overlap:
        launches = [model._part("launch", row) + model.loop_time(row) for row in rows]
        for i, row in enumerate(rows):
            before = row.get("previous_duration_s", float("nan")) if i else float("nan")
            previous = (before, launches[i - 1]) if before == before else \
                behind_itself(partial(model._part, features=row))
            predicted[i] = model.overlapped(row, predicted[i], previous)
    if include_host:
        predicted += np.array([model.host_time(row) for row in rows])
    return predicted
