"""Prediction intervals calibrated on the held-out table: split-conformal margins, held out by class.

NOTE: sim.interval propagates three error sources through the simulation; on the held-out table
that holds 90% of cells pooled, not in every model-and-load group (Qwen3-8B at 50% load: 31 of
36), because what it leaves out (a model's bias on one kind of traffic, queueing at a load) is
shared by a class's cells. A conformalised interval (Romano et al., "Conformalized Quantile
Regression", 2019) widens each interval in log space by a margin learnt from served cells:
- a cell's score is how far, as a log ratio, the engine's value lies outside [lo, hi]
  (s = max(ln(engine / hi), ln(lo / engine)); negative inside);
- the calibration unit is a served cell (one class at one load on one GPU): its metrics come from
  the same runs and miss together, so a unit scores its worst metric;
- a model's margin is the ceil((K + 1) level)-th smallest of its K unit scores (the largest where
  that exceeds K), never below 0 (an interval is only widened); the widened interval is
  [lo e^-m, hi e^m].
Scores are pooled over a model's GPUs and loads: one group (a GPU and a load) holds 3-6 classes,
too few units for a 90% quantile, and a class's misses are its own (the H200's two misses at 50%
load are both conversation's). Held out by class: a cell's margin comes from the model's units of
the other workload classes (leave_one_class_out), so the coverage reported for a class is of
intervals that never saw it; margins() takes every class, for intervals of new workloads.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

POOL = ["model"]  # the cells whose scores set a margin
UNIT = ["workload", "hardware", "load"]  # a served cell: its metrics' worst score
LEVEL = 0.9


def scores(table: pd.DataFrame) -> pd.Series:
    """Each cell's conformal score (module NOTE); NaN where it has no interval."""
    lo, hi, engine = (table[c].astype(float) for c in ("sim_lo", "sim_hi", "engine"))
    valid = (lo > 0) & (hi > 0) & (engine > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.maximum(np.log(engine / hi), np.log(lo / engine))
    return score.where(valid)


def margin(calibration: np.ndarray, level: float = LEVEL) -> float:
    """The split-conformal margin of these scores: their ceil((K + 1) level)-th smallest (the
    largest where that exceeds K), at least 0; NaN without scores."""
    values = np.sort(calibration[np.isfinite(calibration)])
    if not len(values):
        return math.nan
    k = min(math.ceil((len(values) + 1) * level), len(values))
    return max(0.0, float(values[k - 1]))


def unit_scores(table: pd.DataFrame) -> np.ndarray:
    """The worst score of each served cell (UNIT) of the table."""
    return table.assign(score=scores(table)).groupby(UNIT, sort=False)["score"].max().to_numpy()


def leave_one_class_out(table: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """table (cells with intervals: sim_lo, sim_hi, engine) with conformal_margin, sim_lo_conformal,
    sim_hi_conformal and in_interval_conformal: each cell widened by the margin of its model's
    served cells of the other workload classes."""
    out = table.assign(conformal_margin=np.nan)
    for _, pool in out.groupby(POOL, sort=False):
        for workload in pool["workload"].unique():
            mine = pool["workload"] == workload
            out.loc[pool.index[mine], "conformal_margin"] = margin(unit_scores(pool[~mine]), level)
    return _widened(out)


def margins(table: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """Per model, the margin from every served cell (for intervals of new workloads) and their count."""
    rows = []
    for key, part in table.groupby(POOL, sort=False):
        units = unit_scores(part)
        rows.append({**dict(zip(POOL, key)), "served_cells": len(units), "conformal_margin": margin(units, level)})
    return pd.DataFrame(rows)


def _widened(table: pd.DataFrame) -> pd.DataFrame:
    factor = np.exp(table["conformal_margin"].astype(float))
    lo, hi = table["sim_lo"].astype(float) / factor, table["sim_hi"].astype(float) * factor
    engine = table["engine"].astype(float)
    known = lo.notna() & hi.notna() & engine.notna()
    return table.assign(sim_lo_conformal=lo, sim_hi_conformal=hi,
                        in_interval_conformal=((lo <= engine) & (engine <= hi)).where(known))
