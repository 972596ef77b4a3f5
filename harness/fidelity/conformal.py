"""Prediction intervals calibrated on the held-out table: group-conditional (Mondrian) split-conformal
margins, each class held out of its own.

NOTE: sim.interval propagates three error sources through the simulation; on the held-out table
that holds 90% of cells pooled, not in every model-and-load group, because what it leaves out (a
model's bias on one kind of traffic, queueing at a load) is shared by a group's cells. A
conformalised interval (Romano et al., "Conformalized Quantile Regression", 2019) widens each
interval in log space by a margin learnt from served cells:
- a cell (one metric of one class at one load on one GPU) scores how far, as a log ratio, the
  engine's value lies outside [lo, hi] (s = max(ln(engine / hi), ln(lo / engine)); negative
  inside); the score is measured from the propagated interval's edges, which already widen with
  the simulator's own spread at a load;
- margins are calibrated per group (GROUP: model, GPU and load; Vovk's Mondrian conformal
  prediction), so the guarantee is per group, as the target asks, and a load or GPU whose errors
  run larger does not borrow the narrower margins of the others;
- a cell's margin comes from the cells of its group's other workload classes only
  (leave_one_class_out): neither the cell nor any metric of its class, which come from the same
  runs, calibrates its interval;
- the margin of K calibration scores is the ceil((K + 1) level)-th smallest, never below 0 (an
  interval is only widened); where that rank exceeds K (K < 9 at 90%) no finite margin carries the
  guarantee, the margin is infinite and the cell is flagged as too few cells (in_interval_conformal
  NaN), never counted as covered. The widened interval is [lo e^-m, hi e^m].
The guarantee (coverage at least `level` in expectation) holds where the group's cells are
exchangeable. A group's cells of one class share its runs and its model error, so the cells are
not independent; with classes as the exchangeable units the same rank rule would need at least 9
other classes in a group, which the protocol's 1-7 classes a group do not have.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

GROUP = ["model", "hardware", "load"]  # one margin per group: the cells whose scores calibrate it
LEVEL = 0.9


def scores(table: pd.DataFrame) -> pd.Series:
    """Each cell's conformal score (module NOTE); NaN where it has no interval."""
    lo, hi, engine = (table[c].astype(float) for c in ("sim_lo", "sim_hi", "engine"))
    valid = (lo > 0) & (hi > 0) & (engine > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.maximum(np.log(engine / hi), np.log(lo / engine))
    return score.where(valid)


def rank(count: int, level: float = LEVEL) -> int:
    """The finite-sample conformal rank ceil((count + 1) level) (1-based); above count, no finite
    margin holds the level. The small tolerance keeps (9 + 1) x 0.9 at 9, not 10, in floating point."""
    return math.ceil((count + 1) * level - 1e-9)


def fewest_cells(level: float = LEVEL) -> int:
    """The fewest calibration scores that give a finite margin at this level (9 at 90%)."""
    count = 0
    while rank(count, level) > count:
        count += 1
    return count


def margin(calibration: np.ndarray, level: float = LEVEL) -> float:
    """The split-conformal margin of these scores: their ceil((K + 1) level)-th smallest, at least
    0; infinite where that rank exceeds K (too few scores for the level, none included)."""
    values = np.sort(calibration[np.isfinite(calibration)])
    k = rank(len(values), level)
    if k > len(values):
        return math.inf
    return max(0.0, float(values[k - 1]))


def leave_one_class_out(table: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """table (cells with intervals: sim_lo, sim_hi, engine) with calibration_cells, conformal_margin,
    sim_lo_conformal, sim_hi_conformal and in_interval_conformal: each cell widened by the margin of
    its group's cells of the other workload classes (NaN in_interval_conformal where too few)."""
    score = scores(table).to_numpy(dtype=float)
    workload = table["workload"].to_numpy()
    margins_out = np.full(len(table), np.nan)
    counts = np.zeros(len(table), dtype=int)
    for rows in table.groupby(GROUP, sort=False).indices.values():
        for name in pd.unique(workload[rows]):
            mine = workload[rows] == name
            calibration = score[rows[~mine]]
            margins_out[rows[mine]] = margin(calibration, level)
            counts[rows[mine]] = int(np.isfinite(calibration).sum())
    return _widened(table.assign(calibration_cells=counts, conformal_margin=margins_out))


def margins(table: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Per group, the margin from every class's cells (for intervals of new workloads) and their
    count; infinite where the group has too few cells."""
    rows = []
    for key, part in table.groupby(GROUP, sort=False):
        calibration = scores(part).to_numpy(dtype=float)
        rows.append({**dict(zip(GROUP, key)), "calibration_cells": int(np.isfinite(calibration).sum()),
                     "conformal_margin": margin(calibration, level)})
    return pd.DataFrame(rows, columns=[*GROUP, "calibration_cells", "conformal_margin"])


def _widened(table: pd.DataFrame) -> pd.DataFrame:
    m = table["conformal_margin"].astype(float)
    factor = np.exp(m)
    lo, hi = table["sim_lo"].astype(float) / factor, table["sim_hi"].astype(float) * factor
    engine = table["engine"].astype(float)
    known = lo.notna() & hi.notna() & engine.notna() & np.isfinite(m)
    return table.assign(sim_lo_conformal=lo, sim_hi_conformal=hi,
                        in_interval_conformal=((lo <= engine) & (engine <= hi)).where(known))
