"""The serving loop's own host work per step, chosen for the simulator from a harness run and
loop_cost's timings, and checked on the engine server's steps of the same output.

    python -m experiments.serve.loop_figures OUT --loop-cost LOOP_COST_MD [--case azure_50]

OUT: bench_serve's --out folder whose steps record loop_s (harness/output/recording.py);
LOOP_COST_MD: experiments/serve/loop_cost.py's table, timed on the same device host. The figures,
in seconds at the profile's host (sim.profiled_overlap, SimConfig.loop_s / loop_per_seq_s; the
simulator scales them by backend.host_scale as the launches):

- per sequence: loop_cost's harness loop, (us at its larger batch - at its smaller) / the
  difference in sequences (a fake executor: the loop's Python alone, no wait for a device);
- per step: the harness case's decode graph steps of at most BASE_SEQS sequences, the lower
  quartile of loop_s less the per-sequence part (loop_s is the loop's own work plus any wait for
  the device's result; the steps that did not wait are its low end);
- both divided by that case's measured host speed (its decode graph launches against the profile's
  fit, sim.host_speed): the loop runs on the host its launches measure.
- the server core's extra (serve.loop_extra_s / loop_extra_per_seq_s): loop_cost's server loop
  without its token sender less the harness loop, read the same way. The sender's turns at the
  GIL land mostly in launch_s (experiments/serve/server_steps.md), which the engine server's
  measured host (bench_serve --sim-host engine) already holds; its figure is printed beside.

The check (never used to choose): per case and batch size, the engine server's recorded loop_s
(lower quartile and median) against the figures with the server's extra at that case's measured
server host, and its decode graph steps' periods against the steady state priced without and
with the loop's work (max(device, launch) and max(device, launch + loop)); the harness's own
against the figures at its host.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.loop_host import cases_of, decode_steps, split_server
from experiments.serve.split_inputs import unpack
from experiments.serve.step_prices import SIM
from harness.compare.tables import markdown
from sim.profiled import ProfiledCostModel
from sim.step_table import complete_columns

BASE_SEQS = 8  # decode steps this small are where loop_s's low end is the loop's own work
QUANTILE = 0.25


SIM_LOOP_FIELDS = ("backend.loop_s", "backend.loop_per_seq_s", "serve.loop_extra_s", "serve.loop_extra_per_seq_s")


def sim_loop_overrides(text: str) -> list[str]:
    """bench_serve --sim-loop: `off` (none) or four seconds, LOOP_S,PER_SEQ_S,EXTRA_S,EXTRA_PER_SEQ_S
    (this module's figures), as the simulator server's overrides; ValueError naming the flag."""
    if text == "off":
        return []
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) != len(SIM_LOOP_FIELDS) or not all(0 <= v < 1 for v in values):
        raise ValueError(f"--sim-loop: off, or four seconds in [0, 1) for {','.join(SIM_LOOP_FIELDS)} "
                         f"(python -m experiments.serve.loop_figures prints them), got {text!r}")
    return [f"{field}={value:.6g}" for field, value in zip(SIM_LOOP_FIELDS, values, strict=True)]


def loop_cost_table(path: Path) -> pd.DataFrame:
    """loop_cost's markdown table: sequences and us a step of each loop (harness, server, server_sender)."""
    rows = [[float(x) for x in re.findall(r"[\d.]+", line)] for line in path.read_text().splitlines()
            if re.match(r"\|\s*\d", line)]
    if len(rows) < 2 or any(len(r) != 4 for r in rows):
        raise SystemExit(f"error: {path}: not loop_cost's table (| sequences | harness | server | server_sender |)")
    return pd.DataFrame(rows, columns=["seqs", "harness", "server", "server_sender"]).sort_values("seqs")


def line(table: pd.DataFrame, column: str, minus: str | None = None) -> tuple[float, float]:
    """(us at zero sequences, us per sequence) through loop_cost's smallest and largest batch."""
    us = table[column] - (table[minus] if minus else 0.0)
    slope = float((us.iloc[-1] - us.iloc[0]) / (table["seqs"].iloc[-1] - table["seqs"].iloc[0]))
    return float(us.iloc[0] - slope * table["seqs"].iloc[0]), slope


def figures(steps: pd.DataFrame, scale: float, table: pd.DataFrame) -> dict[str, float]:
    """The figures of the module docstring, seconds at the profile's host."""
    per_seq_us = line(table, "harness")[1]
    small = decode_steps(steps)
    small = small[small["num_seqs"] <= BASE_SEQS]
    base_us = float(np.quantile(small["loop_s"] * 1e6 - per_seq_us * small["num_seqs"], QUANTILE))
    extra = line(table, "server", "harness")
    sender = line(table, "server_sender", "harness")
    return {"loop_s": base_us * 1e-6 / scale, "loop_per_seq_s": per_seq_us * 1e-6 / scale,
            "loop_extra_s": extra[0] * 1e-6 / scale, "loop_extra_per_seq_s": extra[1] * 1e-6 / scale,
            "sender_extra_s": sender[0] * 1e-6 / scale, "sender_extra_per_seq_s": sender[1] * 1e-6 / scale,
            "host_scale": scale, "steps": float(len(small))}


def check(steps: pd.DataFrame, scale: float, base: float, per_seq: float) -> pd.DataFrame:
    """Per batch size: recorded loop_s (lower quartile, median) against (base + per_seq x seqs) x scale, us."""
    table = decode_steps(steps)
    grouped = table.groupby("seqs", observed=True)
    out = grouped.agg(steps=("loop_s", "size"), mean_seqs=("num_seqs", "mean"),
                      loop_p25=("loop_s", lambda s: s.quantile(QUANTILE) * 1e6),
                      loop_p50=("loop_s", lambda s: s.median() * 1e6))
    out["priced"] = (base + per_seq * out["mean_seqs"]) * scale * 1e6
    out["p25_pct"] = 100 * (out["priced"] / out["loop_p25"] - 1)
    out.insert(0, "seqs", [f"{interval.left + 1}-{interval.right}" for interval in out.index])
    return out.reset_index(drop=True).round(2)


def periods(steps: pd.DataFrame, scale: float, model: ProfiledCostModel, base: float, per_seq: float) -> pd.DataFrame:
    """Per batch size, decode graph steps' recorded period (start to the next start) against the
    steady state priced from their features at the host scale: max(device, launch) without the
    loop's work, max(device, launch + loop) with it (device: the fit's back-to-back duration), ms."""
    table = decode_steps(steps)
    rows = complete_columns(table.assign(duration_s=table["duration"])).to_dict("records")
    device = np.array([model.predict_features(row) for row in rows])
    launch = np.array([model.overlap_parts(row)[0] for row in rows]) * scale
    loop = (base + per_seq * table["num_seqs"].to_numpy(float)) * scale
    table = table.assign(without=np.maximum(device, launch), with_loop=np.maximum(device, launch + loop))
    grouped = table.groupby("seqs", observed=True)
    out = grouped.agg(steps=("period", "size"), period=("period", "median"), priced=("without", "median"),
                      priced_loop=("with_loop", "median")) * [1, 1e3, 1e3, 1e3]
    out["pct"] = 100 * (out["priced"] / out["period"] - 1)
    out["loop_pct"] = 100 * (out["priced_loop"] / out["period"] - 1)
    out.insert(0, "seqs", [f"{interval.left + 1}-{interval.right}" for interval in out.index])
    return out.reset_index(drop=True).round(3)


def report(out: Path, loop_cost: Path, case: str) -> str:
    table = loop_cost_table(loop_cost)
    with tempfile.TemporaryDirectory() as tmp:
        folders = unpack(out, Path(tmp), ("harness", "engine_server"))
        plan = cases_of(folders["harness"])
        served = split_server(pd.read_csv(folders["engine_server"] / "steps.csv.gz"), [name for name, _ in plan])
        owns = {name: pd.read_csv(folders["harness"] / name / "steps.csv.gz") for name, _ in plan}
    if case not in owns:
        raise SystemExit(f"error: --case {case!r}: not among the cases {list(owns)}")
    if "loop_s" not in owns[case].columns:
        raise SystemExit(f"error: {out}: the harness's steps have no loop_s (recorded since "
                         "harness.output.recording keeps it)")
    model = host.profile_model([*SIM, *[o for o in dict(plan)[case] if o.startswith(("model=", "hardware="))]])
    if model is None:
        raise SystemExit("error: no profiled model for the case's model and hardware")
    chosen = figures(owns[case], host.measured(owns[case], model)[0], table)
    flag = ",".join(f"{chosen[k]:.4g}" for k in ("loop_s", "loop_per_seq_s", "loop_extra_s", "loop_extra_per_seq_s"))
    lines = [f"# The serving loop's own work: chosen on {case}'s harness run, checked on the engine server", "",
             markdown(pd.DataFrame([chosen]).T.reset_index().set_axis(["figure", "value"], axis=1)), "",
             f"bench_serve's simulator server with them: `--sim-loop {flag}`", ""]
    for name, _ in plan:
        for label, steps, base, per_seq in (
                ("harness", owns[name], chosen["loop_s"], chosen["loop_per_seq_s"]),
                ("engine server", served[name], chosen["loop_s"] + chosen["loop_extra_s"],
                 chosen["loop_per_seq_s"] + chosen["loop_extra_per_seq_s"])):
            scale = host.measured(steps, model)[0]
            lines += [f"## {name}, {label} (host {scale:.3f})", "", "Recorded loop_s against priced, us:", "",
                      markdown(check(steps, scale, base, per_seq)), "",
                      "Decode graph periods, recorded against priced without and with the loop's work, ms:", "",
                      markdown(periods(steps, scale, model, base, per_seq)), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder")
    parser.add_argument("--loop-cost", type=Path, required=True, help="loop_cost.py's table from the device host")
    parser.add_argument("--case", default="azure_50", help="the case whose harness run sets the per-step figure")
    args = parser.parse_args(argv)
    print(report(args.out, args.loop_cost, args.case))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
