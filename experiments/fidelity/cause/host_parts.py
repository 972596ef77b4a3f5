"""Which host parts follow the serving host's speed: each engine run's replayed steps priced under
rules that scale different host parts by the run's measured speed, by kind of step, and the lead
the run's prefill graphs waited on an idle device against the grid's. No GPU needed.

s is the run's host speed against the profile's (sim.host_speed.measured_host_scale: the median
ratio of its decode graph steps' recorded launches to the launch fit). The rules:
  grid        nothing scaled: the profile's host
  all         launches, lead, host fit and launch delay x s (the rule before this tool)
  launch      launches x s
  no_lead     launches, host fit and launch delay x s (sim.host_speed.with_host_scale)
  own_launch  each regime's launches x that regime's own median ratio in the run (recorded
              launch_s over the launch fit); the lead kept. It reads eager prefills' launches to
              price eager prefills, so it is a bound on what one speed a run can reach, not a rule
Each kind of step (decode graph, prefill graph, eager prefill, eager decode; after a decode step,
after a prefill, after idle: the loop slept for an arrival) gets measured and priced seconds and
err = priced / measured - 1, as host_scales.py prices a replay.

The lead probe (<out>_lead.csv): a prefill graph step on an idle device costs its device time plus
its whole lead (sim.profiled_overlap). Its measured time less the gpu fit, the fit's own error
taken off (gpu_err: measured over the gpu fit of the run's prefill graphs whose lead the step before
hid, free > 2 leads), over the lead fit, is the lead the serving host took against the grid's.
The profiles of the committed calls have no host fit and a launch delay of 0, so launch and
no_lead price alike; which rule those two follow is not decided here.

    python -m experiments.fidelity.cause.host_parts STEPS_DIR PROFILE --call h100_0.6b --out STEM
    python -m experiments.fidelity.cause.host_parts --summary STEM.csv [...] --out SUMMARY.csv
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity.cause.host_scales import REPLAY, replay_steps
from experiments.fidelity.step_groups import predecessor
from sim.host_speed import HOST_SCALE_REGIME, LAUNCH_DELAY, measured_host_scale, with_part_scales
from sim.profiled import HOST_REGIME, ExtrapolationWarning, ProfiledCostModel

RULES = ("grid", "all", "launch", "no_lead", "own_launch")
KIND_NAMES = {"decode_graph": "decode graph", "prefill_graph": "prefill graph", "prefill": "eager prefill",
              "decode_eager": "eager decode"}
HIDDEN_LEADS = 2.0  # a step whose predecessor left this many leads of host time free waited none


def regime_ratios(steps: pd.DataFrame, model: ProfiledCostModel) -> dict[str, float]:
    """Each regime's median ratio of recorded launch_s to the launch fit in one run."""
    ratios = {}
    for regime, part in steps.groupby("regime"):
        priced = np.array([model.overlap_parts(row)[0] for row in part.to_dict("records")])
        recorded = part["launch_s"].to_numpy(dtype=float)
        ok = (priced > 0) & np.isfinite(recorded)
        if ok.any():
            ratios[str(regime)] = float(np.median(recorded[ok] / priced[ok]))
    return ratios


def rule_scales(rule: str, scale: float, ratios: dict[str, float]) -> dict[str, float]:
    """with_part_scales' factors of one rule (module docstring)."""
    every = {"launch": scale, "lead": scale, HOST_REGIME: scale, LAUNCH_DELAY: scale}
    return {"grid": {}, "all": every, "launch": {"launch": scale},
            "no_lead": {k: v for k, v in every.items() if k != "lead"},
            "own_launch": {f"launch:{regime}": ratio for regime, ratio in ratios.items()}}[rule]


def step_kinds(steps: pd.DataFrame) -> pd.Series:
    """'<kind>, <predecessor>' of each replayed step."""
    kind = steps["regime"].map(KIND_NAMES).fillna(steps["regime"])
    return kind + ", " + predecessor(steps)


def run_rows(path: Path, model: ProfiledCostModel, call: str) -> tuple[list[dict], dict]:
    """One replay's rows: each kind of step (and all steps) under each rule; and its lead probe."""
    match = REPLAY.search(path.name)
    if match is None:
        raise ValueError(f"{path}: not a replay (<class>_<load>_<repeat>.csv.gz)")
    steps = replay_steps(path)
    scale, ratios = measured_host_scale(steps, model), regime_ratios(steps, model)
    head = {"call": call, **match.groupdict(), "host_scale": scale}
    kinds = step_kinds(steps)
    measured = steps["measured_execute_s"]
    rows = []
    for rule in RULES:
        priced = pd.Series(with_part_scales(model, rule_scales(rule, scale, ratios)).predict(steps), index=steps.index)
        for kind, chosen in [("all steps", kinds.notna()), *((k, kinds == k) for k in sorted(kinds.unique()))]:
            rows.append({**head, "kind": kind, "rule": rule, "steps": int(chosen.sum()),
                         "measured_s": float(measured[chosen].sum()), "predicted_s": float(priced[chosen].sum()),
                         "err": float(priced[chosen].sum() / measured[chosen].sum() - 1.0)})
    launch_ratios = {f"launch_ratio_{regime}": ratio for regime, ratio in ratios.items()}
    return rows, {**head, **launch_ratios, **lead_probe(steps, model)}


def lead_probe(steps: pd.DataFrame, model: ProfiledCostModel) -> dict:
    """The lead a run's prefill graphs waited on an idle device against the lead fit (module docstring)."""
    rows = steps.to_dict("records")
    gpu = np.array([model.overlap_parts(row)[1] for row in rows])
    lead = np.array([model._part("lead", row) for row in rows])
    measured = steps["measured_execute_s"].to_numpy(dtype=float)
    free = (steps["measured_execute_s"].shift(1) - steps["launch_s"].shift(1)).clip(lower=0).to_numpy(dtype=float)
    after = predecessor(steps).to_numpy()
    graph = (steps["regime"] == "prefill_graph").to_numpy() & (lead > 0) & (gpu > 0)
    hidden = graph & (after != "after idle") & (free > HIDDEN_LEADS * lead)
    idle = graph & (after == "after idle")
    if not hidden.any() or not idle.any():
        return {"idle_prefill_graphs": int(idle.sum())}
    gpu_err = measured[hidden].sum() / gpu[hidden].sum() - 1.0
    waited = measured[idle] - gpu[idle] * (1.0 + gpu_err)
    return {"idle_prefill_graphs": int(idle.sum()), "gpu_err": float(gpu_err),
            "lead_fit_ms": float(1e3 * lead[idle].mean()), "lead_waited_ms": float(1e3 * waited.mean()),
            "lead_ratio": float(waited.sum() / lead[idle].sum())}


def summary(tables: list[pd.DataFrame], min_steps: int) -> pd.DataFrame:
    """Per call, kind and rule over the loaded runs (offline drains hide every lead): the range of
    err over runs and the pooled err; kinds with fewer than min_steps steps in a run left out."""
    table = pd.concat(tables)
    table = table[(table["load"].astype(str) != "offline") & (table["steps"] >= min_steps)]
    grouped = table.groupby(["call", "kind", "rule"], sort=False)
    out = grouped.agg(runs=("err", "size"), err_min=("err", "min"), err_max=("err", "max"),
                      measured_s=("measured_s", "sum"), predicted_s=("predicted_s", "sum")).reset_index()
    out["err_pooled"] = out["predicted_s"] / out["measured_s"] - 1.0
    return out.drop(columns=["measured_s", "predicted_s"])


def print_summary(table: pd.DataFrame) -> None:
    """The summary as 'min..max' percent per kind (rows) and rule (columns), one block per call."""
    for call, part in table.groupby("call", sort=False):
        cells = part.assign(cell=[f"{100 * lo:+.1f}..{100 * hi:+.1f}" for lo, hi in zip(part["err_min"],
                                                                                     part["err_max"], strict=True)])
        print(f"== {call} (loaded runs; err = priced / measured - 1, min..max over runs)")
        print(cells.pivot(index="kind", columns="rule", values="cell")[list(RULES)].to_string())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="STEPS_DIR PROFILE, or with --summary this tool's CSVs")
    parser.add_argument("--call", help="the call's name in the rows (e.g. h100_0.6b)")
    parser.add_argument("--summary", action="store_true", help="summarise this tool's CSVs")
    parser.add_argument("--min-steps", type=int, default=20, help="--summary: fewest steps of a kind in a run")
    parser.add_argument("--out", type=Path, required=True, help="path stem (the CSVs) or, with --summary, a CSV")
    args = parser.parse_args(argv)
    if args.summary:
        table = summary([pd.read_csv(path) for path in args.inputs], args.min_steps)
        table.to_csv(args.out, index=False)
        print_summary(table)
        return 0
    if len(args.inputs) != 2 or args.call is None:
        print("error: give STEPS_DIR PROFILE and --call (or --summary CSV...)", file=sys.stderr)
        return 2
    steps_dir, profile = args.inputs
    paths = sorted(steps_dir.glob("*.csv.gz"))
    if not paths:
        print(f"error: {steps_dir} holds no replays (*.csv.gz)", file=sys.stderr)
        return 2
    model = ProfiledCostModel.load(profile)
    if f"launch:{HOST_SCALE_REGIME}" not in model.fits:
        print(f"error: {profile} has no launch:{HOST_SCALE_REGIME} fit (not an overlapping profile)", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)  # a held-out class leaves the grid's range
        runs = [run_rows(path, model, args.call) for path in paths]
    table = pd.DataFrame([row for rows, _ in runs for row in rows])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(f"{args.out}.csv", index=False)
    pd.DataFrame([probe for _, probe in runs]).to_csv(f"{args.out}_lead.csv", index=False)
    print(pd.DataFrame([probe for _, probe in runs]).round(3).to_string(index=False))
    print_summary(summary([table], args.min_steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
