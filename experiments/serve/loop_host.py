"""The engine server's core loop against the harness's loop, step by step, on a bench_serve output.

    python -m experiments.serve.loop_host OUT [OUT ...] [--cases azure_50,mooncake_50]

OUT: bench_serve's --out folder (harness.tar.gz and engine_server.tar.gz, or the folders they pack).
The engine server served every case in one process, so its step table is cut into cases at its long
sleeps (the benchmark's pauses between cases, over SPLIT_SLEEP_S), in the order of the harness's
plan.json. Per case, the decode CUDA-graph steps (followed by a step with no sleep before it) are
grouped by their number of sequences, and per group the two loops' medians are set side by side:

- `launch`: the host time of submit() (build, upload, replay: the recorded launch_s);
- `period`: start to the next step's start; with overlapped steps the device is never idle
  between them (host_s 0), so it is the longer of the device's work and the host's whole
  iteration (submit, read the previous result, update, admit, schedule, record);
- `rest`: period less launch, step by step: the host's own work between submits where the
  step is host-bound, or the device's time beyond the launch where it is not;
- `loop` (tables recorded since harness.output.recording keeps loop_s): the host time from one
  submit()'s return to the next one's call, measured, not inferred: the loop's own work per step
  (read a result, update, admit, schedule, record; in the server also its hand-off and the token
  sender's turns at the GIL);
- `_pct`: the server's against the harness's.

A closing table gives each case's measured host speed (sim.host_speed.measured_host_scale: the
median ratio of decode graph launches to the profile's fit) for both loops.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.split_inputs import unpack
from experiments.serve.step_prices import SIM
from harness.compare.tables import markdown

SPLIT_SLEEP_S = 2.0  # a sleep this long before a step: the benchmark paused between cases
BUCKETS = [0, 2, 4, 8, 16, 32, 64, 1024]  # sequences in a decode step (right-closed)


def cases_of(harness: Path) -> list[tuple[str, list[str]]]:
    """(case, its overrides) in the order bench_serve ran them (the harness's plan.json)."""
    plan = json.loads((harness / "plan.json").read_text())
    return [(Path(entry["out"]).name, entry["overrides"]) for entry in plan]


def split_server(steps: pd.DataFrame, names: list[str]) -> dict[str, pd.DataFrame]:
    """The engine server's step table cut at the pauses between cases."""
    starts = [0, *[int(i) for i in np.flatnonzero(steps["slept_s"].to_numpy() > SPLIT_SLEEP_S) if i > 0]]
    if len(starts) != len(names):
        raise SystemExit(f"error: the engine server's steps show {len(starts)} cases (sleeps over {SPLIT_SLEEP_S} s), "
                         f"the harness's plan {len(names)}: {names}")
    ends = [*starts[1:], len(steps)]
    return {name: steps.iloc[a:b].reset_index(drop=True) for name, a, b in zip(names, starts, ends)}


def decode_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Decode graph steps followed, with no sleep, by another step: their period and rest."""
    table = steps.copy()
    table["period"] = table["start"].shift(-1) - table["start"]
    table["rest"] = table["period"] - table["launch_s"]
    follows = table["slept_s"].shift(-1).fillna(1.0) == 0
    table = table[(table["kind"] == "decode") & (table["cuda_graph"] == 1) & follows]
    return table.assign(seqs=pd.cut(table["num_seqs"], BUCKETS))


def compare(server: pd.DataFrame, harness: pd.DataFrame) -> pd.DataFrame:
    """Per group of sequences: steps, medians of launch, period and rest (ms) of both, and %."""
    parts = []
    for name, steps in (("server", server), ("harness", harness)):
        grouped = decode_steps(steps).groupby("seqs", observed=True)
        medians = {"launch": ("launch_s", "median"), "period": ("period", "median"), "rest": ("rest", "median")}
        if "loop_s" in steps.columns and "loop_s" in server.columns and "loop_s" in harness.columns:
            medians["loop"] = ("loop_s", "median")
        table = grouped.agg(steps=("period", "size"), **medians)
        for column in medians:
            table[column] *= 1e3
        parts.append(table.add_prefix(f"{name}_"))
    both = pd.concat(parts, axis=1)
    for column in medians:
        both[f"{column}_pct"] = 100 * (both[f"server_{column}"] / both[f"harness_{column}"] - 1)
    both.insert(0, "seqs", [f"{interval.left + 1}-{interval.right}" for interval in both.index])
    return both.reset_index(drop=True)


def report(out: Path, wanted: list[str] | None) -> str:
    lines = [f"# {out}", ""]
    hosts = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = unpack(out, Path(tmp), ("harness", "engine_server"))
        plan = cases_of(folders["harness"])
        served = split_server(pd.read_csv(folders["engine_server"] / "steps.csv.gz"), [name for name, _ in plan])
        for name, overrides in plan:
            if wanted is not None and name not in wanted:
                continue
            own = pd.read_csv(folders["harness"] / name / "steps.csv.gz")
            if "launch_s" not in own.columns or "launch_s" not in served[name].columns:
                raise SystemExit(f"error: {name}: a step table without launch_s (steps not overlapped: no "
                                 "async scheduling, as on a CPU); nothing to compare")
            lines += [f"## {name}", "", markdown(compare(served[name], own)), ""]
            model = host.profile_model([*SIM, *[o for o in overrides if o.startswith(("model=", "hardware="))]])
            if model is not None:
                hosts.append({"case": name, "server_host": host.measured(served[name], model)[0],
                              "harness_host": host.measured(own, model)[0]})
    if hosts:
        table = pd.DataFrame(hosts)
        table["server_pct"] = 100 * (table["server_host"] / table["harness_host"] - 1)
        lines += ["## measured host speed (x the profile's)", "", markdown(table), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outs", type=Path, nargs="+", help="bench_serve --out folders")
    parser.add_argument("--cases", type=lambda s: s.split(","), default=None, help="cases (default: every case)")
    args = parser.parse_args(argv)
    for out in args.outs:
        print(report(out, args.cases), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
