"""Fit the profiled cost model from an engine profile and say how well it predicts steps it never saw.

Inputs: a profile (harness.calibration.profiling: rows of set "grid" and "random") and, optionally, the steps
of a real engine run recorded by the harness (steps.csv: features, `duration` = the executor's
measured time, `host_s` = the loop's time around it).

The fit uses the grid rows and the real steps for the executor's time (a real run has what a grid
of repeated shapes lacks: ragged batches that change every step, the loop between them), and the
real steps' host_s for the host time. A profile of an engine that overlaps steps (it has launch_s)
takes the executor's time from the grid alone: see fit_calibration. The random shapes are never fitted. Validation sets
(validation table, one row per set and regime):
- grid_split: a random 20% of the grid, predicted by a model fitted on the other 80% (+ real steps);
- random_shapes: the random shapes (ragged, off-grid sizes), by the final model;
- random_shapes_expected (an MoE grid whose rows carry the distinct experts each step touched):
  the same shapes priced with the expected count of their tokens instead, as a simulated step is;
- real_steps: a random half of the real steps, by a model fitted on the grid and the other half.
The steps of the workloads a comparison then runs are the held-out test of the final model.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from sim.features import EXPECTED_EXPERTS
from sim.prefill_programs import PrefillPrograms
from sim.profiled import (
    EAGER_REGIMES,
    REGIMES,
    ExtrapolationWarning,
    ProfiledCostModel,
    table_regimes,
)
from sim.profiled_validation import priced_measurement

VALIDATION_SETS = ("grid_split", "random_shapes", "random_shapes_expected", "real_steps")


def real_step_table(steps: pd.DataFrame) -> pd.DataFrame:
    """A recorded run's steps.csv as a step-timing table (duration_s = the executor's time), with
    previous_duration_s: the measured duration of the step before (NaN for a run's first step),
    which the profiled model's overlap pricing reads."""
    if "num_tokens" not in steps.columns:
        raise ValueError("steps table has no step features: record the run (engine runs record by default)")
    table = steps.rename(columns={"duration": "duration_s"})
    keep = [c for c in table.columns if c not in ("kind",)]
    table = table[keep].copy()
    previous = table["duration_s"].shift(1)
    if "step" in table.columns:
        previous = previous.where(table["step"] != 0)
    table["previous_duration_s"] = previous
    return table


def with_seeded_rows(steps: pd.DataFrame, temperature: float) -> pd.DataFrame:
    """Steps recorded before num_seeded was a feature: a harness workload gives every request a
    seed, so with temperature > 0 every sampled row was a seeded one."""
    if "num_seeded" in steps.columns:
        return steps
    return steps.assign(num_seeded=steps["num_sampled"] if temperature > 0 else 0)


STALL_FACTOR = 2.0  # a real step slower than this multiple of the grid's prediction stalled


def fit_calibration(profile: pd.DataFrame, real_steps: pd.DataFrame | None = None,
                    graphs=(), programs: PrefillPrograms | None = None) -> ProfiledCostModel:
    """Executor time from the profile's grid rows and the real steps; host time from the real steps.

    NOTE: a real step can stall (a garbage-collector pause inside execute()): one such row weighs
    like hundreds under a relative-error fit. Real rows slower than STALL_FACTOR x what the grid
    alone predicts keep their host time but not their executor time. programs: the prefill fits
    take the prefill kernel's program term (sim.prefill_programs)."""
    grid = profile[profile["set"] == "grid"] if "set" in profile.columns else profile
    grid = grid.drop(columns=["host_s"], errors="ignore")
    if real_steps is None or not len(real_steps):
        return ProfiledCostModel.fit(grid, graphs, prefill_programs=programs)
    real = real_step_table(real_steps).drop(columns=["previous_duration_s"])
    if "launch_s" in grid.columns:
        # NOTE: an overlapping engine's profile: the grid measured each shape as the engine serves
        # it, and what a real step's predecessor hid of it is priced separately (sim.profiled), so
        # the real steps' durations (hidden part already taken off) would fit the wrong quantity.
        # Launch times come from the grid and the real steps (measured as it serves: the sampler's
        # new batch compositions, the collector); the loop's delay before a launch from the real
        # eager steps' durations after their measured predecessors.
        model = ProfiledCostModel.fit(pd.concat([grid, real.assign(duration_s=np.nan)], ignore_index=True),
                                      graphs, prefill_programs=programs)
        model.launch_delay_s = fit_launch_delay(model, real_step_table(real_steps))
        return model
    first = ProfiledCostModel.fit(grid, graphs, prefill_programs=programs)
    stalled = real["duration_s"].to_numpy() > STALL_FACTOR * _quiet(first.predict, real)
    real = real.assign(duration_s=real["duration_s"].where(~stalled))
    return ProfiledCostModel.fit(pd.concat([grid, real], ignore_index=True), graphs, prefill_programs=programs)


LAUNCH_DELAYS_S = tuple(np.round(np.r_[np.arange(0, 0.005, 0.00025), np.arange(0.005, 0.03, 0.001), 1.0], 5))


def fit_launch_delay(model: ProfiledCostModel, real: pd.DataFrame) -> float:
    """The launch delay (sim.profiled) whose pricing of the real eager steps, each after its measured
    predecessor, sums closest to their measured time (1 s: nothing is hidden)."""
    eager = table_regimes(real).isin(EAGER_REGIMES) & real["previous_duration_s"].notna()
    if not eager.any() or not model.prices_overlap:
        return 0.0
    measured = real.loc[eager, "duration_s"].sum()
    best, best_error = 0.0, np.inf
    for delay in LAUNCH_DELAYS_S:
        model.launch_delay_s = float(delay)
        predicted = _quiet(model.predict, real)[eager.to_numpy()].sum()
        if abs(predicted / measured - 1.0) < best_error - 1e-4:
            best, best_error = float(delay), abs(predicted / measured - 1.0)
    return best


def error_rows(label: str, table: pd.DataFrame, predicted: np.ndarray, measured: np.ndarray) -> list[dict]:
    """Error statistics of one validation set, overall and per regime."""
    rel = (predicted - measured) / measured
    groups = [("all", np.ones(len(table), dtype=bool))]
    if len(table):
        reg = table_regimes(table).to_numpy()
        groups += [(r, reg == r) for r in REGIMES if (reg == r).any()]
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


def validate(profile: pd.DataFrame, real_steps: pd.DataFrame | None, graphs=(),
             seed: int = 0, programs: PrefillPrograms | None = None) -> tuple[ProfiledCostModel, pd.DataFrame]:
    """The calibrated model and its held-out errors (see the module docstring). The model keeps
    the held-out relative errors as its residuals (sim.interval): the real steps' where there are
    any (they are served steps), else the grid split's and the random shapes'. programs: as
    fit_calibration takes them."""
    model = fit_calibration(profile, real_steps, graphs, programs)
    grid = profile[profile["set"] == "grid"].reset_index(drop=True)
    real = real_step_table(real_steps).reset_index(drop=True) if real_steps is not None else grid.iloc[:0]
    rng = np.random.default_rng(seed)
    rows, residuals = [], {}

    def held_out(label: str, fitted: ProfiledCostModel, test: pd.DataFrame) -> None:
        predicted, measured = _quiet(fitted.predict, test), priced_measurement(test)
        rows.extend(error_rows(label, test, predicted, measured))
        residuals[label] = (predicted - measured) / measured

    held = rng.random(len(grid)) < 0.2
    held_out("grid_split", fit_calibration(grid[~held], real, graphs, programs), grid[held])
    random = profile[profile["set"] == "random"]
    if len(random):
        held_out("random_shapes", model, random)
        if EXPECTED_EXPERTS in random.columns:  # an MoE grid of measured counts: priced as the simulator prices
            held_out("random_shapes_expected", model, random.assign(moe_distinct_experts=random[EXPECTED_EXPERTS]))
    if len(real) >= 2:
        held = rng.random(len(real)) < 0.5
        held_out("real_steps", fit_calibration(grid, real[~held], graphs, programs), real[held])
    pool = residuals.get("real_steps", np.r_[residuals["grid_split"], residuals.get("random_shapes", [])])
    model.residuals = kept_residuals(pool)
    return model, pd.DataFrame(rows)


MAX_RESIDUALS = 500


def kept_residuals(pool: np.ndarray) -> tuple[float, ...]:
    """The residuals a model file keeps: all of them, or MAX_RESIDUALS evenly spaced quantiles
    (the same distribution, a bounded file)."""
    pool = np.asarray(pool, dtype=float)
    pool = pool[np.isfinite(pool)]
    if len(pool) > MAX_RESIDUALS:
        pool = np.quantile(pool, np.linspace(0.0, 1.0, MAX_RESIDUALS))
    return tuple(map(float, np.round(pool, 6)))


def _quiet(predict, table: pd.DataFrame) -> np.ndarray:
    # Held-out rows may lie just outside what the partial fit saw; the error table is the report.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        return predict(table)
