"""A simulated run with a prediction interval on its latency percentiles (sim.interval): the run
itself, then IntervalConfig.draws runs under perturbed step prices; the summary gains
<metric>_lo / <metric>_hi for each of sim.interval.INTERVAL_METRICS."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.config import RunConfig
from harness.convert import ConfigError
from harness.run import RunOutcome, run_once
from sim import build_sim_executor, configured_cost_model
from sim.cost_model import CostModel
from sim.interval import IntervalConfig, interval_columns, perturbed_models
from sim.profiled import ProfiledCostModel


def default_cost_model(rc: RunConfig) -> Callable[[], CostModel]:
    return lambda: configured_cost_model(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler)


def simulate_with_interval(rc: RunConfig, config: IntervalConfig, make_inner: Callable[[], CostModel] | None = None,
                           residuals=None, progress: bool = False, record: bool | None = None) -> RunOutcome:
    """rc on the simulator with an interval. make_inner: a fresh cost model per run (default: the one
    rc.sim names); residuals: the per-step relative errors to resample (default: the profiled
    model's, none for the roofline model, whose interval is then the machine spread alone)."""
    if rc.backend != "sim":
        raise ConfigError(f"interval: a prediction interval needs backend=sim, got backend={rc.backend!r}")
    config = config.for_model(rc.model.name)
    make_inner = make_inner or default_cost_model(rc)
    point_model = make_inner()
    if residuals is None:
        residuals = point_model.residuals if isinstance(point_model, ProfiledCostModel) else ()

    def run_with(cost_model: CostModel, label: str, keep: bool | None) -> RunOutcome:
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost_model)
        return run_once(rc, progress, executor=executor, label=label, record=keep)

    point = run_with(point_model, "sim", record)
    draws = [run_with(m, f"interval draw {i}", False).summary.metrics()
             for i, m in enumerate(perturbed_models(make_inner, residuals, config))]
    summary = point.summary.with_extras({
        **interval_columns(point.summary.metrics(), draws, config.level), "interval_level": config.level,
        "interval_draws": config.draws, "interval_machine_spread": config.machine_spread})
    return dataclasses.replace(point, summary=summary)
