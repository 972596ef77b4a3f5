"""What experiments/serve/ttft_split.py reads of a bench_serve output: each stage's folder, the host
each server is simulated at, the settings the simulator's server ran with, the harness's own run."""

from __future__ import annotations

import tarfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.step_prices import SIM
from sim.decode_programs import GH100_DECODE_PROGRAMS_PER_SM

SERVERS = ("engine_server", "sim_server")
# the simulator server's settings beyond the backend and its cost model (bench_serve's --sim
# defaults), taken where an output has no simulator server's folder (its stage run elsewhere)
# (plan_after_launches: arrivals during a prefill's launches join the next step, as in the engine
# server's loop; experiments/serve/burst_split.md, chosen on run 9; decode_programs_baseline=grid_waves:
# Azure's inter-token latency, chosen on run 12, h200_run12_baseline/)
SIM_SERVER_DEFAULTS = ("backend.repeated_reads=overlap", "backend.decode_programs_baseline=grid_waves",
                       f"hardware.decode_programs_per_sm={GH100_DECODE_PROGRAMS_PER_SM}",
                       "backend.plan_after_launches=true")
# bench_serve's default simulator server also prices Qwen3-0.6B's decode graph launches by the
# launch line of these grids (docs/host_speed.md; chosen on serving runs 7 and 8, checked on run 9)
LAUNCH_LINE_GRIDS = {"h200": "experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile.csv.gz",
                     "h100": "experiments/calibration/h100_run6/qwen3_0_6b/profile.csv"}


def launch_line_default(hardware: str) -> list[str]:
    """The launch line setting bench_serve's default simulator server gets on this hardware (none
    where no grid of the GPU is committed)."""
    grid = LAUNCH_LINE_GRIDS.get(hardware)
    root = Path(__file__).resolve().parents[2]
    return [] if grid is None else [f"backend.launch_line_grid={root / grid}"]


def unpack(out: Path, tmp: Path, stages: tuple[str, ...] = ("harness", *SERVERS),
           optional: tuple[str, ...] = ()) -> dict[str, Path]:
    """Each stage's folder (harness, engine_server, sim_server), unpacked into tmp where packed; a
    stage of optional that the output lacks is left out."""
    folders = {}
    for name in stages:
        if (out / name).is_dir():
            folders[name] = out / name
        elif (out / f"{name}.tar.gz").is_file():
            with tarfile.open(out / f"{name}.tar.gz") as tar:
                tar.extractall(tmp, filter="data")
            folders[name] = tmp / name
        elif name in optional:
            continue
        else:
            raise SystemExit(f"error: {out} has neither {name}/ nor {name}.tar.gz (bench_serve's --out)")
    return folders


def server_hosts(folders: dict[str, Path], overrides: list[str]) -> dict[str, float]:
    """The host each server is simulated at: the engine server's measured speed (its steps.csv.gz
    against the profile the case's simulation prices with), the simulator server's as it was run
    (its backend.host_scale override); a server without one is left out (the profile's host)."""
    hosts = {}
    steps = host.server_steps(folders["engine_server"].parent, "engine_server")
    model = host.profile_model([*SIM, *overrides])
    if steps is not None and model is not None and not np.isnan(scale := host.measured(steps, model)[0]):
        hosts["engine_server"] = scale
    for key, value in sim_server_settings(folders):
        if key == "backend.host_scale":
            hosts["sim_server"] = float(value)
    return hosts


def sim_server_settings(folders: dict[str, Path]) -> list[tuple[str, str]]:
    """The simulator server's backend.* and hardware.* overrides as (key, value) (its
    .hydra/overrides.yaml), with its serve.loop_extra_* (the server core's own loop work) added to
    backend.loop_*; SIM_SERVER_DEFAULTS where the output has no simulator server's folder."""
    if "sim_server" not in folders:
        lines = list(SIM_SERVER_DEFAULTS)
    else:
        given = folders["sim_server"] / ".hydra" / "overrides.yaml"
        if not given.is_file():
            return []
        lines = [line.strip()[2:] for line in given.read_text().splitlines()
                 if line.strip().startswith(("- backend.", "- hardware.", "- serve.loop_extra"))]
    settings = dict(line.partition("=")[::2] for line in lines)
    for extra, loop in (("serve.loop_extra_s", "backend.loop_s"),
                        ("serve.loop_extra_per_seq_s", "backend.loop_per_seq_s")):
        if extra in settings:
            settings[loop] = f"{float(settings.get(loop, 0.0)) + float(settings.pop(extra)):.6g}"
    return list(settings.items())


def served_overrides(folders: dict[str, Path], overrides: list[str]) -> list[str]:
    """overrides, with the simulator server's settings (but its host: server_hosts) it does not set."""
    taken = {o.split("=", 1)[0] for o in [*SIM, *overrides]} | {"backend.host_scale"}
    return overrides + [f"{key}={value}" for key, value in sim_server_settings(folders) if key not in taken]


def harness_run(folder: Path, overrides: list[str]) -> tuple[pd.DataFrame | None, float]:
    """The harness's own run of a case (its requests.csv; None where the pack has none) and the
    speed of its host (its steps' decode graph launches; 1 where not measured)."""
    if not (folder / "requests.csv").is_file():
        return None, 1.0
    requests = pd.read_csv(folder / "requests.csv")
    model = host.profile_model([*SIM, *overrides])
    scale = np.nan
    if (folder / "steps.csv.gz").is_file() and model is not None:
        scale = host.measured(pd.read_csv(folder / "steps.csv.gz"), model)[0]
    return requests[requests["finish_reason"] != "aborted"], 1.0 if np.isnan(scale) else scale
