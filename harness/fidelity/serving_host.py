"""The held-out protocol's "profiled_host" rows (fidelity.price_serving_host, on by default): the
profiled model with its host parts priced for the machine that served the cell (sim.host_speed). The
table makes them the cell's "profiled" rows (harness.fidelity.report.at_measured_host).

The grid profile's launches were measured on the host that ran the grid; the cell's engine runs
record every step's launches on the serving host, whose speed the protocol reads off their decode
graph steps (measured_host_scale, and how much it moves from step to step, measured_host_jitter: a
step kind whose price does not follow its launch) and prices the cell with. Each engine repeat is
simulated at its own host and the predictions are averaged, as the engine value averages the
repeats. The jitter is recorded in the row, not priced: on the H100 code_completion cells one
speed a run came closer on average (docs/host_speed.md). A cell whose runs recorded no decode
graph launches, or a profile without launch fits, gets no such row.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from harness.compare.study import sim_run_config
from harness.config import RunConfig
from harness.fidelity.interval import simulate_with_interval
from harness.fidelity.report import MEASURED_HOST
from harness.fidelity.steps import expected_experts, with_moe_experts
from harness.run import RunOutcome
from sim.features import DistinctExperts
from sim.host_speed import measured_host_jitter, measured_host_scale
from sim.interval import IntervalConfig
from sim.profiled import ProfiledCostModel

LABEL = MEASURED_HOST[0]


def host_scales(engine_runs: list[RunOutcome], profile_path: str,
                experts: DistinctExperts | None = None) -> list[tuple[float, float]] | None:
    """Each engine run's host, (speed against the profile's, step-to-step jitter); None where one
    cannot be measured. experts: an MoE model's expected count for steps without their own, as the
    replays price them (harness.fidelity.steps.with_moe_experts)."""
    model = ProfiledCostModel.load(profile_path)
    try:
        tables = [with_moe_experts(run.steps, experts) for run in engine_runs]
        return [(measured_host_scale(steps, model), measured_host_jitter(steps, model)) for steps in tables]
    except ValueError:
        return None


def averaged(summaries: list[dict]) -> dict:
    """The mean of each numeric entry over the summaries (the keys of the first)."""
    out = {}
    for key, value in summaries[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(np.mean([float(s[key]) for s in summaries]))
    return out


def serving_host_rows(rc: RunConfig, profile_path: str, meta: dict, engine_runs: list[RunOutcome],
                      interval: IntervalConfig) -> dict[str, dict]:
    """{LABEL: the averaged summary, with host_scale} of one cell; {} where no host was measured."""
    scales = host_scales(engine_runs, profile_path, expected_experts(rc, meta))
    if scales is None:
        return {}
    sim_rc = sim_run_config(rc, "profiled", profile_path, meta)
    summaries = []
    for scale, _ in scales:
        scaled = dataclasses.replace(sim_rc, sim=dataclasses.replace(sim_rc.sim, host_scale=scale))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # extrapolation is what a held-out class is for
            summaries.append(dict(simulate_with_interval(scaled, interval).summary.to_row()))
    return {LABEL: {**averaged(summaries), "host_scale": float(np.mean([s for s, _ in scales])),
                    "host_jitter": float(np.mean([j for _, j in scales]))}}
