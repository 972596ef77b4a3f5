"""A simulated fleet with a prediction interval on its latency percentiles (sim.interval): the fleet
run itself, then IntervalConfig.draws runs of it under perturbed step prices; the fleet's summary
gains <metric>_lo / <metric>_hi for each of sim.interval.INTERVAL_METRICS, as a single run's does.

In a draw every replica prices its steps with a PerturbedCostModel around a fresh cost model of its
own settings: the per-step scatter is drawn for each replica apart, the run factor (machine times
the fit's bias) once per pool. A pool is a set of machines of one kind bought together and priced
by one fit, so its replicas move together: an aggregated fleet is one pool, a disaggregated fleet's
prefill and decode replicas are two, drawn independently (sim.interval.pool_run_factors), as they
may be two GPU types. Near saturation queueing amplifies a price error many times over (a decode
pool at 80% of its capacity: a 1.2% dearer step moved a 1P1D fleet's simulated TPOT P50 by 16
points, experiments/disagg/sensitivity.md); the interval carries that amplification, because each
draw is the whole fleet simulated again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import numpy as np

from harness.config import RunConfig
from harness.convert import ConfigError
from harness.output.summary import RunSummary
from sim import configured_cost_model
from sim.cost_model import CostModel
from sim.interval import IntervalConfig, PerturbedCostModel, interval_columns, pool_run_factors
from sim.profiled import ProfiledCostModel


class HasSummary(Protocol):
    summary: RunSummary


Outcome = TypeVar("Outcome", bound=HasSummary)
# (pool index, a replica's run config) -> the cost model that replica prices its steps with
PoolPricing = Callable[[int, RunConfig], CostModel]


def fleet_with_interval(rc: RunConfig, config: IntervalConfig, pools: Sequence[RunConfig],
                        run: Callable[[PoolPricing | None, str], Outcome]) -> Outcome:
    """run(None, "sim"), the fleet as configured, with its summary's interval from config.draws more
    runs, run(pricing, label) each. pools: one run config per pool (its cost model's residuals set
    the pool's fit bias); rc: the fleet's (its backend and model)."""
    if rc.backend != "sim":
        raise ConfigError(f"interval: a prediction interval needs backend=sim, got backend={rc.backend!r}")
    config = config.for_model(rc.model.name)
    rng = np.random.default_rng(config.seed)
    factors = pool_run_factors([_residuals(_fresh(pool)) for pool in pools], config, rng)
    point = run(None, "sim")
    draws = []
    for draw in range(config.draws):
        steps_rng = np.random.default_rng(rng.integers(2**63))

        def pricing(pool: int, replica: RunConfig, draw: int = draw,
                    steps_rng: np.random.Generator = steps_rng) -> CostModel:
            inner = _fresh(replica)
            return PerturbedCostModel(inner, _residuals(inner), float(factors[pool, draw]),
                                      np.random.default_rng(steps_rng.integers(2**63)))

        draws.append(run(pricing, f"interval draw {draw}").summary.metrics())
    summary = point.summary.with_extras({
        **interval_columns(point.summary.metrics(), draws, config.level), "interval_level": config.level,
        "interval_draws": config.draws, "interval_machine_spread": config.machine_spread})
    return dataclasses.replace(point, summary=summary)  # type: ignore[type-var]


def _fresh(rc: RunConfig) -> CostModel:
    return configured_cost_model(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler)


def _residuals(model: CostModel) -> tuple[float, ...]:
    """The profiled model's held-out residuals; none for the roofline model, whose interval is the
    machine spread alone (as a single run's)."""
    return model.residuals if isinstance(model, ProfiledCostModel) else ()
