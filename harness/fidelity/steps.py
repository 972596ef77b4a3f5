"""The held-out protocol's per-step replays (fidelity.steps_dir): every engine run's steps, each
priced by every cost model from its recorded features (harness.compare.tables.replay), with those
features beside them, so a file can be priced again by another fit. A cell's percentiles say that
a class is mispriced; these tables say which steps are.

Files: <steps_dir>/<class>_<load>_<repeat>.csv.gz (load "offline" for the drain). They are raw
per-step tables: kept out of the repository, summarised by experiments/fidelity/step_groups.py.
Beside them <class>_<load>_windows.csv, one row per engine run and simulated run of the cell
(harness.fidelity.windows: where a request's time between its first and last token went), a
summary small enough to keep.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from harness.compare.study import sim_run_config, step_pricer
from harness.compare.tables import replay
from harness.config import RunConfig
from harness.fidelity.windows import window_table
from sim.features import FEATURE_COLUMNS

# kept beside the replay's own columns: what a cost model prices a step from, so a file can be priced again
KEPT_FEATURES = (*FEATURE_COLUMNS, "launch_s", "host_s", "slept_s")


def predictors(rc: RunConfig, cost_models: tuple[str, ...], profile_path: str, meta: dict) -> dict[str, object]:
    """Each cost model as the simulated runs of the cell price steps."""
    return {name: step_pricer(sim_run_config(rc, name, profile_path, meta), meta) for name in cost_models}


def replay_with_features(steps: pd.DataFrame, priced: dict[str, object]) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # extrapolation is what a held-out class is for
        table = replay(steps, priced)
    kept = [c for c in KEPT_FEATURES if c in steps.columns and c not in table.columns]
    return pd.concat([table, steps[kept].reset_index(drop=True)], axis=1)


def write_replays(steps_dir: Path, workload: str, load: str, runs: list[pd.DataFrame],
                  priced: dict[str, object]) -> list[Path]:
    """One file per engine run of the cell (module docstring); the paths written."""
    steps_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for repeat, steps in enumerate(runs):
        path = steps_dir / f"{workload}_{load}_{repeat}.csv.gz"
        replay_with_features(steps, priced).to_csv(path, index=False)
        paths.append(path)
    return paths


def write_windows(steps_dir: Path, workload: str, load: str,
                  runs: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> Path:
    """<steps_dir>/<class>_<load>_windows.csv: harness.fidelity.windows.window_table of the cell's runs."""
    steps_dir.mkdir(parents=True, exist_ok=True)
    path = steps_dir / f"{workload}_{load}_windows.csv"
    window_table(runs).to_csv(path, index=False)
    return path
