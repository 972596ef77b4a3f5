"""Each engine run's host speed against the profile's (sim.host_speed.measured_host_scale: its
decode graph steps' recorded launches over the launch fit; host_jitter, the standard deviation of
their log: sim.host_speed.measured_host_jitter), and what pricing the run's steps with
it does to the replay: every step's and the eager prefills' measured time against the profiled
price, with the profile's host (1) and with the run's. No GPU needed.

Writes <out>_runs.csv (one row per replay) and <out>.csv (workload, load, host_scale: each cell's
runs pooled, the median over their decode graph steps; what resimulate.py --host-scales reads).
The drain's rows also give device_scale (sim.device_speed): each drain run's measured step time
over its price at the run's host, averaged over the runs (what resimulate.py --device-scale takes).
A diagnosis, not the GPU's speed: a drain runs at the power limit, which the grid's bursts do not
(docs/host_speed.md, "The GPU's speed").

    python -m experiments.fidelity.cause.host_scales /work/wt/cc_h100/qwen3-0.6b/code_completion/steps \
        experiments/fidelity/h100_leakfree/profile_model.csv \
        --out experiments/fidelity/code_completion_h100/qwen3-0.6b/host_scales
"""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from pathlib import Path

import pandas as pd

from sim.host_speed import measured_host_jitter, measured_host_scale, with_host_scale
from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from sim.profiled_regimes import regime_of
from sim.step_table import complete_columns

REPLAY = re.compile(r"(?P<workload>.+)_(?P<load>offline|[0-9.]+)_(?P<repeat>[0-9]+)\.csv\.gz$")


def replay_paths(steps_dir: Path) -> list[Path]:
    """The replays (*.csv.gz) of a held-out call's steps/ folder; a ValueError naming it where it holds none."""
    paths = sorted(steps_dir.glob("*.csv.gz"))
    if not paths:
        raise ValueError(f"{steps_dir} holds no replays (*.csv.gz)")
    return paths


def replay_steps(path: Path) -> pd.DataFrame:
    """A replay's steps as sim.profiled.predict reads them: each after its measured predecessor
    (none after the loop slept for an arrival), as harness.compare.tables.replay priced them."""
    table = complete_columns(pd.read_csv(path).assign(duration_s=1.0))
    table["previous_duration_s"] = table["measured_execute_s"].shift(1).where(table["step"] != 0)
    if "slept_s" in table.columns:
        table.loc[table["slept_s"] > 0, "previous_duration_s"] = 0.0
    table["regime"] = [regime_of(row) for row in table.to_dict("records")]
    return table


def run_row(path: Path, model: ProfiledCostModel) -> dict:
    match = REPLAY.search(path.name)
    if match is None:
        raise ValueError(f"{path}: not a replay (<class>_<load>_<repeat>.csv.gz)")
    steps = replay_steps(path)
    scale = measured_host_scale(steps, model)
    measured = steps["measured_execute_s"]
    eager = steps["regime"] == "prefill"
    row = {**match.groupdict(), "steps": len(steps), "eager_steps": int(eager.sum()), "host_scale": scale,
           "host_jitter": measured_host_jitter(steps, model)}
    for label, priced in (("profile_host", model), ("run_host", with_host_scale(model, scale))):
        predicted = pd.Series(priced.predict(steps), index=steps.index)
        row[f"err_all_{label}"] = predicted.sum() / measured.sum() - 1.0
        row[f"err_eager_{label}"] = predicted[eager].sum() / measured[eager].sum() - 1.0 if eager.any() else None
    row["device_scale"] = 1.0 / (1.0 + row["err_all_run_host"])  # measured over priced at the run's host
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps_dir", type=Path, help="a held-out call's steps/ folder (fidelity.steps_dir)")
    parser.add_argument("profile", type=Path, help="the profiled model the call priced with")
    parser.add_argument("--out", type=Path, required=True, help="path stem of the two CSVs")
    args = parser.parse_args(argv)
    try:
        paths = replay_paths(args.steps_dir)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model = ProfiledCostModel.load(args.profile)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)  # a held-out class leaves the grid's range
        runs = pd.DataFrame([run_row(path, model) for path in paths])
        cells = []
        for (workload, load), part in runs.groupby(["workload", "load"], sort=False):
            steps = pd.concat([replay_steps(args.steps_dir / f"{workload}_{load}_{r}.csv.gz") for r in part["repeat"]])
            device = float(part["device_scale"].mean()) if load == "offline" else float("nan")
            cells.append({"workload": workload, "load": load, "host_scale": measured_host_scale(steps, model),
                          "device_scale": device})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs.to_csv(f"{args.out}_runs.csv", index=False)
    pd.DataFrame(cells).to_csv(f"{args.out}.csv", index=False)
    print(runs.round(3).to_string(index=False))
    print(pd.DataFrame(cells).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
