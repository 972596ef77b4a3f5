"""A smooth price for decode CUDA-graph launches: a + b x graph size, fitted robustly to a grid.

The profiled model's launch fit of decode graph steps ("launch:decode_graph", sim.profiled_regimes)
is piecewise-linear with a knot at every captured graph size, fitted by least squares: one grid
row taken while the host was slow moves its size's knot alone. On the H200 profile that left knots
of 0.69, 0.73, 1.91, 1.05, 1.29, 0.87, 1.29, 0.82 ms at sizes 1-64, where served launches rise
smoothly with the batch (docs/host_speed.md, "A smooth decode graph launch price"). A graph
replay's host work is a fixed part (Python, the replay call) and a part per sequence (building
and copying its inputs), so this prices it as a line in the graph size, monotone (b >= 0).

The rule: each graph size's median launch_s over the grid's decode graph rows (a slow row at a
size does not move it while that size has three rows or more), then a Theil-Sen line over those
medians: the slope is the median of the slopes of every pair of sizes (Theil 1950; Sen 1968;
breakdown point 29%: a few slow sizes do not tilt it), clipped at 0, and the intercept the median
of each size's median less slope x size. Context and seeds are left out: the launch builds the
same inputs for any context length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.piecewise import PiecewiseLinearFit
from sim.profiled import ProfiledCostModel
from sim.profiled_regimes import regime_of
from sim.repeated_reads import copy_with_fits
from sim.step_table import complete_columns

LAUNCH_REGIME = "launch:decode_graph"
SIZE = "graph_batch_size"


@dataclass(frozen=True)
class LaunchLine:
    intercept_s: float
    slope_s: float  # seconds per sequence of graph size, >= 0
    sizes: tuple[float, ...]  # the grid's graph sizes it was fitted on

    def price(self, size: float) -> float:
        return self.intercept_s + self.slope_s * size


def size_medians(grid: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(graph sizes, median launch_s) of a grid's decode graph rows with a recorded launch_s."""
    if "launch_s" not in grid.columns:
        raise ValueError("the launch line's grid has no launch_s column (an overlapping profile's grid has one)")
    table = complete_columns(grid.assign(duration_s=1.0) if "duration_s" not in grid else grid)
    rows = table[[regime_of(row) == "decode_graph" for row in table.to_dict("records")]]
    rows = rows[rows["launch_s"].notna()]
    if rows[SIZE].nunique() < 2:
        raise ValueError("the launch line's grid needs decode graph rows with launch_s at two graph sizes or more")
    medians = rows.groupby(SIZE)["launch_s"].median()
    return medians.index.to_numpy(dtype=float), medians.to_numpy(dtype=float)


def fit_launch_line(grid: pd.DataFrame) -> LaunchLine:
    """The module's rule on a grid (a step-timing table with launch_s)."""
    sizes, medians = size_medians(grid)
    i, j = np.triu_indices(len(sizes), k=1)
    slope = max(float(np.median((medians[j] - medians[i]) / (sizes[j] - sizes[i]))), 0.0)
    intercept = float(np.median(medians - slope * sizes))
    return LaunchLine(intercept, slope, tuple(float(s) for s in sizes))


def line_fit(line: LaunchLine, low: float, high: float) -> PiecewiseLinearFit:
    """The line as a fit over graph sizes low..high (two knots; no other features)."""
    high = max(high, low + 1.0)
    return PiecewiseLinearFit(SIZE, (low, high), (line.price(low), line.price(high)), (), (),
                              ((SIZE, low, high),))


def with_launch_line(model: ProfiledCostModel, line: LaunchLine) -> ProfiledCostModel:
    """A copy of a ProfiledCostModel whose decode graph launches are priced by line (its other
    fits, and everything else, as they were); ValueError where it has no such launch fit."""
    fit = model.fits.get(LAUNCH_REGIME)
    if fit is None:
        raise ValueError(f"backend.launch_line_grid prices the profile's {LAUNCH_REGIME} fit; this profile has none "
                         "(not an overlapping profile)")
    low = min([lo for name, lo, _ in fit.ranges if name == SIZE] + [min(line.sizes)])
    high = max([hi for name, _, hi in fit.ranges if name == SIZE] + [max(line.sizes)])
    return copy_with_fits(model, {**model.fits, LAUNCH_REGIME: line_fit(line, low, high)})


def load_launch_line(path: str | Path) -> LaunchLine:
    """fit_launch_line on a grid CSV (gzip read by its suffix), or a one-line ValueError."""
    try:
        grid = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise ValueError(f"backend.launch_line_grid {path}: not a readable CSV file ({str(error).strip()})") from None
    return fit_launch_line(grid)
