"""Prediction intervals: how far a simulated P50/P90 may be from what the engine will measure.

NOTE: three sources of error, propagated through the simulation (so that queueing amplifies them as
it amplifies real ones) rather than added to the answer:
- the cost model's per-step scatter: each step's price is divided by (1 + r) / (1 + m), r drawn
  with replacement from the calibration's held-out relative residuals (predicted - measured) /
  measured (ProfiledCostModel.residuals, harness.calibration.fit.validate) and m their median, so a
  draw's steps scatter around the fit as the held-out ones did. Independent per step, the scatter
  averages out over a run's thousands of steps; uncentred, it would move every draw the same way
  by the residuals' median and leave the point prediction at one edge of the interval;
- the fit's bias on shapes it did not see: one factor per simulated run, uniform in
  [1 - |m|, 1 + |m|] (a held-out workload may sit on either side of the fit);
- the spread between machines of one kind: one factor per simulated run, uniform in
  [1 - machine_spread, 1 + machine_spread]; machine_spread is the model's measured figure
  (machine_spread(): its latency spread between machines, never below the step-time spread
  between machines) unless a config sets one.
Each of `draws` runs is the whole simulation under one such perturbation. The run factor (machine
times bias) is drawn stratified: its n values are the run factor's quantiles at one uniform in each
of n equal strata of [0, 1) (Latin hypercube sampling in one dimension, McKay et al. 1979), so the
draws span its distribution evenly whatever the seed, and only the within-stratum position and the
per-step scatter are left to chance. The interval of a metric is the (1 - level) / 2 and
(1 + level) / 2 quantiles of its n draws with Hazen's plotting positions ((i - 0.5) / n, the centre
of the i-th stratum), widened to hold the unperturbed prediction. NOTE: with independent draws the
min..max of 19 was an exact 90% prediction interval for another draw, but its ends moved with the
seed (a model-and-load group of the held-out table by up to 5 of 42 cells between seeds); on the
8B's run factor (+-4% machine, +-1.9% bias) with a per-run scatter of 0.3%, the upper end's sd over
400 seeds is 0.0076 in ln for min..max of 19 independent draws, 0.0037 for the 5th largest of 99,
0.0033 for 19 stratified draws at Hazen's position (tests/harness/test_interval_strata.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.core.plan import StepPlan

if TYPE_CHECKING:  # sim.cost_model picks the models this one wraps
    from sim.cost_model import CostModel

# The spread between machines, per model: half the largest relative spread, (max - min) / mean,
# of the engine's TTFT and TPOT P50/P90 between H100 machines that served the same workloads
# (experiments/calibration/engine_repeatability.csv: Qwen3-0.6B on three machines, largest Azure
# TTFT P90, 9.10-10.51 ms; Qwen3-8B on two, Azure TTFT P50, 37.22-38.44 ms;
# tests/harness/test_interval.py derives both from that file). NOTE: those are latency
# percentiles at 70% load, which queueing amplifies from step time; for the 0.6B their spread is an
# upper bound of the step factor's (its decode steps moved 2-4% between those machines), for the
# 8B's two machines, which agreed within 0.5% on TPOT, it is below it (the floor below).
# The measurement is on H100s; another GPU takes its model's figure as it is.
MACHINE_SPREAD = {"qwen3-0.6b": 0.074, "qwen3-8b": 0.016}
# The spread of served step times against a fit's price, across H100 machines: the factor
# multiplies step prices, so this is what it is drawn for, and it is the floor of every model's
# figure (a model's latency spread between a few machines that happened to agree says nothing of
# the next machine). Measured on the calibration runs, none of them a held-out cell: Qwen3-0.6B's
# served decode graph steps over 1.2-3.8% longer than the run-6 fit prices them on three machines
# (experiments/calibration/h100_run6/qwen3_0_6b_repeat/replay_decode.csv), Qwen3-8B's 3.7% longer
# than its own machine's grid fit (h100_run6/qwen3_8b/validation.csv, real_steps decode_graph);
# rounded up to the percent (tests/harness/test_interval.py derives it from those files). The
# grids alone, short bursts of steps, agree within 1% between machines (0.6B's four H100 grids,
# the 8B's two): the served steps' spread is the machine under sustained serving.
DEFAULT_MACHINE_SPREAD = 0.04


def machine_spread(model_name: str) -> float:
    """The machine factor's half-width for a model: MACHINE_SPREAD, never below the step-time
    spread DEFAULT_MACHINE_SPREAD (a model without a latency measurement takes the latter)."""
    return max(MACHINE_SPREAD.get(model_name, DEFAULT_MACHINE_SPREAD), DEFAULT_MACHINE_SPREAD)


INTERVAL_METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "e2e_p90_s")
_FACTOR_GRID = 256  # points per uniform factor of the run factor's quantile function
_MIN_FACTOR = 0.05  # a residual of -95% or below would price a step at 20x: such rows are stalls


@dataclass(frozen=True)
class IntervalConfig:
    level: float = 0.9
    draws: int = 19  # runs under perturbed prices, their run factors one per stratum (module docstring)
    machine_spread: float | None = None  # None: the model's (machine_spread(), for_model())
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"interval.level must be in (0, 1), got {self.level!r}")
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 2:
            raise ValueError(f"interval.draws must be an int >= 2, got {self.draws!r}")
        if self.machine_spread is not None and not 0.0 <= self.machine_spread < 1.0:
            raise ValueError(f"interval.machine_spread must be null or in [0, 1), got {self.machine_spread!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"interval.seed must be an int >= 0, got {self.seed!r}")


    def for_model(self, model_name: str) -> IntervalConfig:
        """This config with machine_spread set: the given one, else the model's measured figure."""
        if self.machine_spread is not None:
            return self
        return replace(self, machine_spread=machine_spread(model_name))


class PerturbedCostModel:
    """A cost model whose every step price is divided by a drawn centred residual factor and
    multiplied by one run factor (module docstring)."""

    def __init__(self, inner: CostModel, residuals: Sequence[float], run_factor: float,
                 rng: np.random.Generator) -> None:
        self.inner = inner
        divisors = np.maximum(1.0 + np.asarray(residuals, dtype=float), _MIN_FACTOR)
        self._divisors = divisors / np.median(divisors) if len(divisors) else divisors
        self.run_factor = run_factor  # the machine factor times the bias factor
        self._rng = rng

    def step_time(self, plan: StepPlan) -> float:
        price = self.inner.step_time(plan) * self.run_factor
        if len(self._divisors):
            price /= float(self._divisors[self._rng.integers(len(self._divisors))])
        return price

    def drained(self) -> None:
        self.inner.drained()

    @property
    def prices_lead(self) -> bool:
        """The inner model's (ProfiledCostModel.prices_lead): a perturbed draw prices the same lead."""
        return bool(getattr(self.inner, "prices_lead", False))

    @property
    def power_scale(self) -> float:
        """The inner model's (sim.power_limit: the executor sets it before each step); an
        AttributeError where the inner model has none."""
        return float(self.inner.power_scale)  # type: ignore[attr-defined]

    @power_scale.setter
    def power_scale(self, value: float) -> None:
        self.inner.power_scale = value  # type: ignore[attr-defined]


def perturbed_models(make_inner: Callable[[], CostModel], residuals: Sequence[float],
                     config: IntervalConfig) -> list[PerturbedCostModel]:
    """config.draws perturbed cost models, each around a fresh inner model (cost models keep the
    previous step's price for overlap, so draws must not share one)."""
    if config.machine_spread is None:
        raise ValueError("interval.machine_spread is null: resolve it for the model first (IntervalConfig.for_model)")
    rng = np.random.default_rng(config.seed)
    factors = run_factor_quantiles(stratified_uniforms(config.draws, rng), config.machine_spread,
                                   abs(fit_bias(residuals)))
    models = []
    for run_factor in factors:
        step_rng = np.random.default_rng(rng.integers(2**63))
        models.append(PerturbedCostModel(make_inner(), residuals, float(run_factor), step_rng))
    return models


def pool_run_factors(pool_residuals: Sequence[Sequence[float]], config: IntervalConfig,
                     rng: np.random.Generator) -> np.ndarray:
    """A fleet's run factors, shape (pools, config.draws): each pool (a set of machines with its own
    fit: a disaggregated fleet's prefill and decode pools) draws its own, stratified per pool, so
    the draws pair the pools' strata at random (Latin hypercube sampling over the pools)."""
    if config.machine_spread is None:
        raise ValueError("interval.machine_spread is null: resolve it for the model first (IntervalConfig.for_model)")
    return np.array([run_factor_quantiles(stratified_uniforms(config.draws, rng), config.machine_spread,
                                          abs(fit_bias(residuals))) for residuals in pool_residuals])


def stratified_uniforms(n: int, rng: np.random.Generator) -> np.ndarray:
    """n uniforms in [0, 1), one in each of the strata [i / n, (i + 1) / n), in random order (so a
    draw's index says nothing of its stratum)."""
    return rng.permutation((np.arange(n) + rng.uniform(size=n)) / n)


def run_factor_quantiles(u: np.ndarray, machine_spread: float, bias: float) -> np.ndarray:
    """The run factor's quantiles at u: the factor is the product of two independent uniforms, in
    1 +- machine_spread and 1 +- bias, and its quantile function is read off the products of a
    midpoint grid of each (_FACTOR_GRID points a factor: within 1e-4 of a grid eight times finer,
    tests/harness/test_interval_strata.py)."""
    mid = (np.arange(_FACTOR_GRID) + 0.5) / _FACTOR_GRID
    machine = 1.0 - machine_spread + 2.0 * machine_spread * mid
    fit = 1.0 - bias + 2.0 * bias * mid
    quantiles: np.ndarray = np.quantile(np.outer(machine, fit).ravel(), np.asarray(u, dtype=float))
    return quantiles


def fit_bias(residuals: Sequence[float]) -> float:
    """The fit's held-out bias: the median relative residual (0 without residuals)."""
    return float(np.median(residuals)) if len(residuals) else 0.0


def interval_columns(point: Mapping[str, Any], draws: Sequence[Mapping[str, Any]], level: float,
                     metrics: Sequence[str] = INTERVAL_METRICS) -> dict[str, float]:
    """<metric>_lo and <metric>_hi for each metric: the draws' (1 -+ level) / 2 quantiles at Hazen's
    plotting positions (module docstring), widened to hold the point prediction."""
    out: dict[str, float] = {}
    for metric in metrics:
        values = np.array([d[metric] for d in draws], dtype=float)
        values = values[np.isfinite(values)]
        if not len(values) or not np.isfinite(point[metric]):
            out[f"{metric}_lo"] = out[f"{metric}_hi"] = float("nan")
            continue
        lo, hi = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], method="hazen")
        out[f"{metric}_lo"] = float(min(lo, point[metric]))
        out[f"{metric}_hi"] = float(max(hi, point[metric]))
    return out
