"""The serving host's speed: a profiled model's host parts carried to another host CPU.

NOTE: a profile's launch, lead and host fits (sim.profiled) are host time: Python building and
launching a step, measured on the machine that ran the profiling grid. sim.transfer keeps them
when the GPU changes (the same host is assumed). They do not all carry to another host: on an
H100 machine serving the code_completion class (experiments/fidelity/README.md, "the cause"), every kind
of step's submit() took 1.3-2.1x the grid machine's (decode graphs, prefill graphs and eager
prefills alike, the factor varying run to run), and Qwen3-0.6B's eager prefills of 4-16k tokens,
whose launches (~15 ms) exceed their device work, ran 6-26% longer than priced.

with_host_scale(model, s) prices the parts that follow the host's speed s times the profile's:
the launch fits (SPEED_PARTS), the host fit and the loop's launch delay. The lead (the host time
until the device can start a step) keeps the profile's: on those H100 runs and on an H200 host
whose launches took 1.6-2.1x the grid's, prefill graphs that started on an idle device waited
0.3-0.7x the grid's lead, and scaling the lead priced prefill graphs after a decode step up to 15%
long, where keeping it leaves them within -3..+6%
(experiments/fidelity/cause/host_parts.py: every step kind priced under each rule). An eager step
then costs max(gpu + max(0, lead - free), launch - free) with the slower host's launch; a decode
graph step, whose grid duration holds the grid host's launches, cannot end before the new host's
(sim.profiled.overlapped). The device parts are untouched. with_part_scales prices each part by a
factor of its own (the rules that tool compares).

measured_host_scale(steps, model) reads s off an engine run's step table (harness.output.recording:
launch_s of every step): the median ratio of the recorded launches of decode graph steps to the
model's launch fit. A decode graph step's price does not follow its launch (its device work is
longer), so the ratio measures the host alone and predicts the launch-bound steps it is not
taken from.

The host's speed also moves from step to step: on that H100 the log of the ratio had a standard
deviation of 0.22-0.28, the same for decode graphs, prefill graphs and eager prefills. Priced at
one speed, a cell's steps are right on average but its queues too short near saturation (the
0.6B's TPOT P90 at 80-95% load -24..-27%). with_host_jitter(model, sigma, seed) draws each step's host
speed, exp(N(0, sigma)) times the scaled one (the parts with_host_scale scales, but the launch
delay), from (seed, step) alone (sim.host_draws), so a run is reproducible and fast-forward prices
the same steps as step by step; measured_host_jitter reads sigma off the same decode graph launches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np
import pandas as pd

from sim.profiled import HOST_PARTS, HOST_REGIME, SPEED_PARTS, ProfiledCostModel
from sim.profiled_regimes import regime_of
from sim.repeated_reads import copy_with_fits
from sim.step_table import complete_columns

HOST_SCALE_REGIME = "decode_graph"  # whose recorded launches measure the host (docstring)
MAX_HOST_JITTER = 2.0


HOST_SCALE_MEANING = "the serving host's speed against the profile's; 1: the profile's host"


def check_host_scale(value: object, name: str = "host_scale", meaning: str = HOST_SCALE_MEANING) -> float:
    """value as a float > 0, or a one-line ValueError naming the field and what it means."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a number > 0 ({meaning}), got {value!r}")
    return float(value)


def check_host_jitter(value: object, name: str = "host_jitter") -> float:
    """value as a float in [0, MAX_HOST_JITTER], or a one-line ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= MAX_HOST_JITTER:
        raise ValueError(f"{name} must be a number in [0, {MAX_HOST_JITTER}] (the standard deviation of the log "
                         f"of the host's speed from step to step; 0: one speed), got {value!r}")
    return float(value)


def with_host_jitter(model: ProfiledCostModel, sigma: float, seed: int) -> ProfiledCostModel:
    """A copy of model whose parts that follow the host's speed (SPEED_PARTS and the host fit) take
    exp(N(0, sigma)) times their price, drawn anew for each step from (seed, step) (sim.host_draws)."""
    moved = copy_with_fits(model, dict(model.fits))
    moved.host_jitter, moved.host_seed = check_host_jitter(sigma), seed
    return moved


LAUNCH_DELAY = "launch_delay"  # with_part_scales' name of the loop's launch delay
LOOP = "loop"  # with_part_scales' name of the serving loop's own work (ProfiledCostModel.loop_time)


def with_host_scale(model: ProfiledCostModel, scale: float) -> ProfiledCostModel:
    """A copy of model whose parts that follow the host's speed (SPEED_PARTS, the host fit, the
    launch delay and the serving loop's work) take scale times the profile's; the lead keeps the
    profile's (module docstring)."""
    scale = check_host_scale(scale)
    return with_part_scales(model, {**{part: scale for part in SPEED_PARTS}, HOST_REGIME: scale, LAUNCH_DELAY: scale})


def with_part_scales(model: ProfiledCostModel, scales: Mapping[str, float]) -> ProfiledCostModel:
    """A copy of model with each named host part priced scales[name] times the profile's: a part of
    every regime ("launch", "lead"), a part of one regime ("launch:prefill", before the part's own
    factor), HOST_REGIME (the host fit), LAUNCH_DELAY or LOOP (the serving loop's own work between
    submits; by default the decode graph launches' factor); the rest keep the profile's. The copy's
    host_scale is its decode graph launches' factor: where it is not 1, such a step is held to
    its scaled launches (sim.profiled.overlapped)."""
    known = set(HOST_PARTS) | {f"{part}:{regime}" for part, _, regime in (n.partition(":") for n in model.fits)
                               if part in HOST_PARTS} | {HOST_REGIME, LAUNCH_DELAY, LOOP}
    unknown = sorted(set(scales) - known)
    if unknown:
        raise ValueError(f"unknown host parts {unknown}; known: {sorted(known)}")
    factors = {name: check_host_scale(value, f"scales[{name!r}]") for name, value in scales.items()}
    fits = {}
    for name, fit in model.fits.items():
        factor = factors.get(name, factors.get(name.partition(":")[0], 1.0))
        if factor != 1.0:
            fit = replace(fit, knot_values=tuple(v * factor for v in fit.knot_values),
                          linear_coefs=tuple(c * factor for c in fit.linear_coefs))
        fits[name] = fit
    moved = copy_with_fits(model, fits)
    moved.launch_delay_s = model.launch_delay_s * factors.get(LAUNCH_DELAY, 1.0)
    launches = factors.get(f"launch:{HOST_SCALE_REGIME}", factors.get("launch", 1.0))
    # the serving loop's own work is the same host's Python as the launches: it takes their factor
    loop = factors.get(LOOP, launches)
    moved.loop_s, moved.loop_per_seq_s = model.loop_s * loop, model.loop_per_seq_s * loop
    moved.host_scale = model.host_scale * launches
    return moved


def launch_ratios(steps: pd.DataFrame, model: ProfiledCostModel, regime: str = HOST_SCALE_REGIME) -> np.ndarray:
    """Recorded launch_s over the launch fit's price, for each step of an engine step table (columns:
    the step features and launch_s) in regime (default: decode graphs, which measure the host)."""
    if "launch_s" not in steps.columns:
        raise ValueError("the step table has no launch_s column (an engine run recorded by the harness has one)")
    if not any(name == f"launch:{regime}" for name in model.fits):
        raise ValueError(f"the profile has no launch:{regime} fit (not an overlapping profile)")
    table = complete_columns(steps.assign(duration_s=1.0) if "duration_s" not in steps else steps)
    rows = [row for row in table.to_dict("records") if regime_of(row) == regime and row["launch_s"] == row["launch_s"]]
    fitted = [model.overlap_parts(row)[0] for row in rows]
    ratios = [row["launch_s"] / fit for row, fit in zip(rows, fitted) if fit > 0]
    if not ratios:
        raise ValueError(f"the step table has no {regime} steps with a recorded launch_s")
    return np.array(ratios, dtype=float)


def measured_host_scale(steps: pd.DataFrame, model: ProfiledCostModel) -> float:
    """The run's host against the profile's: the median of launch_ratios."""
    return float(np.median(launch_ratios(steps, model)))


def measured_host_jitter(steps: pd.DataFrame, model: ProfiledCostModel) -> float:
    """How much the run's host speed moves from step to step: the standard deviation of the log of
    launch_ratios (0 for fewer than two steps)."""
    logs = np.log(launch_ratios(steps, model))
    return float(np.std(logs, ddof=1)) if len(logs) > 1 else 0.0
