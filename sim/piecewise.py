"""A piecewise-linear function of one size variable plus linear terms, fitted by least squares.

duration ~= f(size) + sum_i coef_i * feature_i, with f linear between knots (hat basis), so
inside the measured sizes a prediction interpolates between measured shapes. By default the fit
minimises relative error (rows weighted by 1 / duration) because short decode steps matter as much
as long prefills; relative=False fits plain least squares, whose prediction is unbiased in the
mean (what a sum of many noisy small times, such as host overheads, needs). Outside the measured
range of any input the caller is told (see out_of_range).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PiecewiseLinearFit:
    size_feature: str
    knots: tuple[float, ...]
    knot_values: tuple[float, ...]
    linear_features: tuple[str, ...]
    linear_coefs: tuple[float, ...]
    # (feature, lowest, highest) seen in the fitted rows, for every input (size and linear)
    ranges: tuple[tuple[str, float, float], ...]

    @classmethod
    def fit(cls, x: np.ndarray, features: Mapping[str, np.ndarray], y: np.ndarray, size_feature: str,
            max_knots: int = 40, min_support: int = 3, relative: bool = True,
            unless_collinear: Collection[str] = ()) -> PiecewiseLinearFit:
        """unless_collinear: features fitted only where the rows separate them from the size and the
        other features (collinear, below); otherwise absorbed by f like a constant column."""
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if len(y) == 0:
            raise ValueError(f"no rows to fit for {size_feature!r}")
        if not np.all(y > 0) and relative:
            raise ValueError("duration_s must be > 0 in every profiled row")
        knots = _choose_knots(x, max_knots, min_support)
        ranges = [(size_feature, float(x.min()), float(x.max()))]
        columns = [_hat_column(x, knots, k) for k in range(len(knots))]
        linear = []
        for name, values in features.items():
            values = np.asarray(values, dtype=float)
            ranges.append((name, float(values.min()), float(values.max())))
            if np.ptp(values) > 0:  # a constant column is absorbed by f; its range still guards it
                linear.append(name)
                columns.append(values)
        for name in [name for name in linear if name in unless_collinear]:
            i = len(knots) + linear.index(name)
            if collinear(columns[i], columns[:i] + columns[i + 1:]):
                del columns[i], linear[i - len(knots)]
        a = np.column_stack(columns)
        scale = np.abs(a).max(axis=0)
        scale[scale == 0] = 1.0
        weights = 1.0 / y if relative else np.ones_like(y)
        coef, *_ = np.linalg.lstsq(a / scale * weights[:, None], y * weights, rcond=None)
        coef = coef / scale
        n = len(knots)
        return cls(size_feature, tuple(map(float, knots)), tuple(map(float, coef[:n])), tuple(linear),
                   tuple(map(float, coef[n:])), tuple(ranges))

    def predict(self, features: Mapping[str, float]) -> float:
        value = self._interpolate(features[self.size_feature])
        for name, coef in zip(self.linear_features, self.linear_coefs):
            value += coef * features[name]
        return value

    def out_of_range(self, features: Mapping[str, float]) -> list[tuple[str, float, float, float]]:
        """(feature, value, lowest, highest) for each input outside what was measured."""
        out = []
        for name, lo, hi in self.ranges:
            value = features[name]
            if value < lo or value > hi:
                out.append((name, value, lo, hi))
        return out

    def _interpolate(self, x: float) -> float:
        knots = self.knots
        values = self.knot_values
        if len(knots) == 1:
            return values[0]
        # Beyond the ends, extend the first/last segment: the trend of the nearest measurements.
        i = min(max(bisect_right(knots, x) - 1, 0), len(knots) - 2)
        x0 = knots[i]
        slope = (values[i + 1] - values[i]) / (knots[i + 1] - x0)
        return values[i] + slope * (x - x0)


# A column whose least-squares fit on the others leaves less than this share of its variance is
# collinear with them (variance inflation factor above 100, the usual mark of severe collinearity):
# its coefficient would be set by noise and the others would move to compensate.
COLLINEAR_UNEXPLAINED = 0.01


def collinear(column: np.ndarray, others: Sequence[np.ndarray]) -> bool:
    """Whether column is (nearly) a linear combination of others on these rows (1 - R^2 below
    COLLINEAR_UNEXPLAINED; the others include the knots' hat columns, which span every function
    of the size at the knots)."""
    centred = column - column.mean()
    total = float(centred @ centred)
    if total == 0.0 or not others:
        return total == 0.0
    basis = np.column_stack(others)
    coef, *_ = np.linalg.lstsq(basis, column, rcond=None)
    residual = column - basis @ coef
    return float(residual @ residual) < COLLINEAR_UNEXPLAINED * total


def _choose_knots(x: np.ndarray, max_knots: int, min_support: int) -> np.ndarray:
    """Knots at the sizes measured at least min_support times, plus the ends.

    NOTE: a knot with a single row behind it would fit that row exactly and leave the linear terms
    of its neighbourhood unconstrained; profiling grids repeat each size over several contexts, and
    the odd sizes (mixed steps) are interpolated between them instead.
    """
    values, counts = np.unique(x, return_counts=True)
    knots = values[counts >= min_support]
    if len(knots) < 2:
        knots = values
    knots = np.union1d(knots, [values[0], values[-1]])
    if len(knots) > max_knots:
        knots = np.unique(np.quantile(knots, np.linspace(0.0, 1.0, max_knots), method="nearest"))
    return knots


def _hat_column(x: np.ndarray, knots: np.ndarray, k: int) -> np.ndarray:
    """The k-th piecewise-linear basis function (1 at knots[k], 0 at the other knots) at x.

    Knots span the fitted x (they include its min and max), so no extrapolation happens here.
    """
    if len(knots) == 1:
        return np.ones_like(x)
    unit = np.zeros(len(knots))
    unit[k] = 1.0
    return np.asarray(np.interp(x, knots, unit))
