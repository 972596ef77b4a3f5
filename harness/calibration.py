"""Fit the profiled cost model from an engine profile and say how well it predicts steps it never saw.

Inputs: a profile (harness.profiling: rows of set "grid" and "random") and, optionally, the steps
of a real engine run recorded by the harness (steps.csv: features, `duration` = the executor's
measured time, `host_s` = the loop's time around it).

The fit uses the grid rows for the executor's time and the real steps' host_s for the host time;
the random shapes and the real steps' executor times are never fitted, so they are held out.
Validation sets (validation table, one row per set and regime):
- grid_split: a random 20% of the grid, predicted by a model fitted on the other 80%;
- random_shapes: the random shapes (ragged, off-grid sizes), by the model fitted on the whole grid;
- real_steps: the executor time of every real step, by the same model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.profiled import ProfiledCostModel, complete_columns, holdout_validation

VALIDATION_SETS = ("grid_split", "random_shapes", "real_steps")


def real_step_table(steps: pd.DataFrame) -> pd.DataFrame:
    """A recorded run's steps.csv as a step-timing table (duration_s = the executor's time)."""
    if "num_tokens" not in steps.columns:
        raise ValueError("steps table has no step features: record the run (engine runs record by default)")
    table = steps.rename(columns={"duration": "duration_s"})
    keep = [c for c in table.columns if c not in ("kind",)]
    return table[keep]


def regimes(table: pd.DataFrame) -> pd.Series:
    table = complete_columns(table)
    prefill = table["num_prefill_tokens"] > 0
    graph = table["cuda_graph"].astype(bool)
    return pd.Series(np.where(prefill, "prefill", np.where(graph, "decode_graph", "decode_eager")), index=table.index)


def fit_calibration(profile: pd.DataFrame, real_steps: pd.DataFrame | None = None,
                    graph_batch_sizes=()) -> ProfiledCostModel:
    """Executor time from the profile's grid rows; host time from the real steps (if any)."""
    grid = profile[profile["set"] == "grid"] if "set" in profile.columns else profile
    parts = [grid.drop(columns=["host_s"], errors="ignore")]
    if real_steps is not None and "host_s" in real_steps.columns:
        host = real_step_table(real_steps).assign(duration_s=np.nan)
        parts.append(host)
    return ProfiledCostModel.fit(pd.concat(parts, ignore_index=True), graph_batch_sizes)


def error_rows(label: str, table: pd.DataFrame, predicted: np.ndarray, measured: np.ndarray) -> list[dict]:
    """Error statistics of one validation set, overall and per regime."""
    rel = (predicted - measured) / measured
    groups = [("all", np.ones(len(table), dtype=bool))]
    if len(table):
        reg = regimes(table).to_numpy()
        groups += [(r, reg == r) for r in ("prefill", "decode_graph", "decode_eager") if (reg == r).any()]
    rows = []
    for regime, mask in groups:
        if not mask.any():
            continue
        err = np.abs(rel[mask])
        rows.append({"set": label, "regime": regime, "steps": int(mask.sum()),
                     "median_abs_rel_error": float(np.median(err)), "p90_abs_rel_error": float(np.percentile(err, 90)),
                     "max_abs_rel_error": float(err.max()), "mean_rel_error": float(rel[mask].mean()),
                     # the error of the total time of these steps: what a makespan sees
                     "sum_rel_error": float(predicted[mask].sum() / measured[mask].sum() - 1.0)})
    return rows


def validate(profile: pd.DataFrame, real_steps: pd.DataFrame | None, graph_batch_sizes=(),
             seed: int = 0) -> tuple[ProfiledCostModel, pd.DataFrame]:
    """The calibrated model and its held-out errors (see the module docstring)."""
    model = fit_calibration(profile, real_steps, graph_batch_sizes)
    grid = profile[profile["set"] == "grid"]
    rows = []
    _, held = holdout_validation(grid.reset_index(drop=True), 0.2, seed, graph_batch_sizes)
    rows += error_rows("grid_split", held, held["predicted_s"].to_numpy(), held["duration_s"].to_numpy())
    random = profile[profile["set"] == "random"]
    if len(random):
        rows += error_rows("random_shapes", random, model.predict(random), random["duration_s"].to_numpy())
    if real_steps is not None and len(real_steps):
        table = real_step_table(real_steps)
        rows += error_rows("real_steps", table, model.predict(table), table["duration_s"].to_numpy())
    return model, pd.DataFrame(rows)
