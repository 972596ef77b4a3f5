"""The held-out protocol's per-step replays (fidelity.steps_dir): every engine run's steps, each
priced by every cost model from its recorded features (harness.compare.tables.replay), with those
features beside them, so a file can be priced again by another fit. A cell's percentiles say that
a class is mispriced; these tables say which steps are.

Files: <steps_dir>/<class>_<load>_<repeat>.csv.gz (load "offline" for the drain). They are raw
per-step tables: kept out of the repository, summarised by experiments/fidelity/step_groups.py.
Beside them <class>_<load>_windows.csv, one row per engine run and simulated run of the cell
(harness.fidelity.windows: where a request's time between its first and last token went), a
summary small enough to keep.

A mixture-of-experts model's profiled fit prices a step by its distinct experts
(sim.features.MOE_FEATURES). A served run's steps carry the count the engine saw where they have the
column (source "measured"); the engine reads its counter back per step only for the profiling grid,
so served steps get the expectation of their sequences (and a CUDA graph's padding rows:
sim.features.read_sequences) at the cell's routing skew and locality, as the simulator prices its own
steps (source "expected"). The replay keeps the column and its source
(moe_experts_source).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from harness.compare.study import sim_run_config, step_pricer
from harness.compare.tables import replay
from harness.config import RunConfig
from harness.fidelity.windows import window_table
from sim.features import FEATURE_COLUMNS, MOE_FEATURES, DistinctExperts, row_read_sequences

# what a replay's MoE column holds: "measured" (the engine's per-step count) or "expected" (module docstring)
MOE_SOURCE = "moe_experts_source"

# kept beside the replay's own columns: what a cost model prices a step from, so a file can be priced again
KEPT_FEATURES = (*FEATURE_COLUMNS, *MOE_FEATURES, MOE_SOURCE, "launch_s", "host_s", "slept_s")


def predictors(rc: RunConfig, cost_models: tuple[str, ...], profile_path: str, meta: dict) -> dict[str, object]:
    """Each cost model as the simulated runs of the cell price steps."""
    return {name: step_pricer(sim_run_config(rc, name, profile_path, meta), meta) for name in cost_models}


def expected_experts(rc: RunConfig, meta: dict) -> DistinctExperts | None:
    """The expected distinct experts per MoE layer of a step's sequences at the cell's routing skew
    and locality (the engine side's, harness.fidelity.routing); None for a dense model."""
    model = rc.model
    if not model.is_moe:
        return None
    from sim.moe_locality import SequenceRouting

    skew = float(meta.get("moe_routing_skew", 0.0))
    locality = float(meta.get("moe_routing_locality", 0.0))
    return SequenceRouting(model.num_experts, model.num_experts_per_tok, skew, locality).distinct


def with_moe_experts(steps: pd.DataFrame, experts: DistinctExperts | None) -> pd.DataFrame:
    """steps with the MoE column and its source (module docstring); unchanged for a dense model."""
    if experts is None:
        return steps
    if all(name in steps.columns and steps[name].notna().all() for name in MOE_FEATURES):
        return steps.assign(**{MOE_SOURCE: "measured"})
    counts = [experts(row_read_sequences(row)) for row in steps.to_dict("records")]
    return steps.assign(**{name: counts for name in MOE_FEATURES}, **{MOE_SOURCE: "expected"})


def replay_with_features(steps: pd.DataFrame, priced: dict[str, object],
                         experts: DistinctExperts | None = None) -> pd.DataFrame:
    """The replay of one engine run (harness.compare.tables.replay) with the features it was priced
    from; experts: an MoE model's expected count (expected_experts), for steps without their own."""
    steps = with_moe_experts(steps, experts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # extrapolation is what a held-out class is for
        table = replay(steps, priced)
    kept = [c for c in KEPT_FEATURES if c in steps.columns and c not in table.columns]
    return pd.concat([table, steps[kept].reset_index(drop=True)], axis=1)


def write_replays(steps_dir: Path, workload: str, load: str, runs: list[pd.DataFrame],
                  priced: dict[str, object], experts: DistinctExperts | None = None) -> list[Path]:
    """One file per engine run of the cell (module docstring); the paths written. experts: as
    replay_with_features."""
    steps_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for repeat, steps in enumerate(runs):
        path = steps_dir / f"{workload}_{load}_{repeat}.csv.gz"
        replay_with_features(steps, priced, experts).to_csv(path, index=False)
        paths.append(path)
    return paths


def write_windows(steps_dir: Path, workload: str, load: str,
                  runs: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> Path:
    """<steps_dir>/<class>_<load>_windows.csv: harness.fidelity.windows.window_table of the cell's runs."""
    steps_dir.mkdir(parents=True, exist_ok=True)
    path = steps_dir / f"{workload}_{load}_windows.csv"
    window_table(runs).to_csv(path, index=False)
    return path
