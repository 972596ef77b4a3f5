"""The serving host's speed in the serving benchmark: what the engine's server measured, and what
the simulator's server is priced at.

The held-out protocol prices each cell at the host that served it (fidelity.price_serving_host,
harness/fidelity/serving_host.py): the median ratio of an engine run's decode graph launches to the
profile's launch fit (sim.host_speed.measured_host_scale), one speed a run. The benchmark applies
the same rule to the engine's server: the server's core process launches its steps more slowly
than the harness's loop (on one H100, 1.71-1.80x the profile's host against 1.10-1.17x for the
harness's runs of the same requests: the token sender thread and the loop's GIL switches,
harness/serve/handoff.py), and that host time is the server's, so the simulator's server is run at
the engine server's measured speed (`--sim-host engine`, bench_serve's default). The speed is read
from launches alone, never from a latency the benchmark compares, as in the protocol.
"""

from __future__ import annotations

import tarfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from harness.scripting import compose_run_config
from sim.host_speed import check_host_scale, measured_host_jitter, measured_host_scale
from sim.launch_line import load_launch_line, with_launch_line
from sim.profiled import ProfiledCostModel

CHOICES = ("engine", "profile")  # --sim-host: the engine server's measured speed, the profile's host, or a number


def parse_choice(text: str) -> str | float:
    """--sim-host's value: one of CHOICES, or a speed > 0; ValueError naming the allowed values."""
    if text in CHOICES:
        return text
    try:
        return check_host_scale(float(text), "--sim-host")
    except ValueError:
        raise ValueError(f"--sim-host: engine (the engine server's measured host), profile (the profile's, 1) "
                         f"or a speed > 0; got {text!r}") from None


def profile_model(sim: list[str]) -> ProfiledCostModel | None:
    """The profiled model the simulator's server prices with (its overrides' profile, as loaded);
    None for another cost model (a roofline has no host parts to measure a host against)."""
    rc = compose_run_config(sim)
    if rc.sim is None or rc.sim.cost_model != "profiled" or rc.sim.profile_path is None:
        return None
    model = ProfiledCostModel.load(rc.sim.profile_path)
    if rc.sim.launch_line_grid is not None:  # the host is measured against the launches it prices
        model = with_launch_line(model, load_launch_line(rc.sim.launch_line_grid))
    return model


def measured(steps: pd.DataFrame, model: ProfiledCostModel) -> tuple[float, float]:
    """(speed, step-to-step jitter) of the host that ran an engine step table; NaNs where its
    steps hold no decode graph launches."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # extrapolation: the steps are what they are
            return measured_host_scale(steps, model), measured_host_jitter(steps, model)
    except ValueError:
        return float("nan"), float("nan")


def in_window(steps: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """The steps that began in [start, end] (one case of a server that served them all)."""
    return steps[(steps["start"] >= start) & (steps["start"] <= end)]


def server_steps(out: Path, folder: str) -> pd.DataFrame | None:
    """A server's steps.csv.gz from a bench output: its folder, or the tarball bench_serve packed it
    into; None where neither holds one."""
    if (out / folder / "steps.csv.gz").is_file():
        return pd.read_csv(out / folder / "steps.csv.gz")
    if (out / f"{folder}.tar.gz").is_file():
        with tarfile.open(out / f"{folder}.tar.gz") as tar:
            try:
                member = tar.extractfile(f"{folder}/steps.csv.gz")
            except KeyError:
                return None
            return pd.read_csv(member, compression="gzip") if member is not None else None
    return None


def sim_host(choice: str | float, engine_steps: pd.DataFrame | None, model: ProfiledCostModel | None) -> float:
    """The speed the simulator's server is priced at: choice's number, 1 for `profile`, or for
    `engine` the engine server's whole run measured (RuntimeError when it cannot be)."""
    if isinstance(choice, float):
        return choice
    if choice == "profile":
        return 1.0
    if engine_steps is None or model is None:
        raise RuntimeError("--sim-host engine: no engine server step table (run the engine stage, or --merge an "
                           "output that has engine_server.tar.gz); or give --sim-host profile or a number")
    scale, _ = measured(engine_steps, model)
    if np.isnan(scale):
        raise RuntimeError("--sim-host engine: the engine server's steps hold no decode graph launches "
                           "(CUDA graphs off?); give --sim-host profile or a number")
    return scale
