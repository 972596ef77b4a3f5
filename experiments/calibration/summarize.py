"""The README's tables, from the committed result folders (nothing is measured here).

  PYTHONPATH=. python experiments/calibration/summarize.py > experiments/calibration/results.md

Per model folder of a run (h100_run2/<model>): the held-out errors of the fit (validation.csv),
then per workload the comparison against the engine (compare.csv, compare_schedule.csv) for the
profiled model (calibrated on the grid and the offline calibration run), the roofline model, and
the profiled model refitted leaving that workload out (lowo/<workload>/, lowo.sh).

The step table needs the runs' compare_steps.csv, which the tree no longer keeps for runs 1-4
(README: what the run folders keep); `git checkout 69a90b0 -- experiments/calibration/h100_run2`
brings them back.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from harness.compare_tables import markdown  # noqa: E402

RUNS = {"Qwen3-0.6B": HERE / "h100_run2" / "qwen3_0_6b", "Qwen3-8B": HERE / "h100_run2" / "qwen3_8b"}
WORKLOADS = ("bench", "poisson", "azure")
ERRORS = ("input_tok_s", "output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s")


def pct(value: float) -> str:
    return f"{100 * value:+.1f}%"


def validation_table() -> pd.DataFrame:
    rows = []
    for model, folder in RUNS.items():
        table = pd.read_csv(folder / "validation.csv")
        for _, r in table.iterrows():
            rows.append({"model": model, "held-out set": r["set"], "regime": r["regime"], "steps": int(r["steps"]),
                         "median |err|": f"{100 * r['median_abs_rel_error']:.1f}%",
                         "P90 |err|": f"{100 * r['p90_abs_rel_error']:.1f}%",
                         "max |err|": f"{100 * r['max_abs_rel_error']:.1f}%",
                         "error of the sum": pct(r["sum_rel_error"])})
    return pd.DataFrame(rows)


def compare_rows(model: str, workload: str, folder: Path, runs: dict[str, str]) -> list[dict]:
    table = pd.read_csv(folder / "compare.csv").set_index("metric")
    schedule = pd.read_csv(folder / "compare_schedule.csv").set_index("run")
    rows = []
    for label, run in runs.items():
        sched = schedule.loc[run]
        row = {"model": model, "workload": workload, "cost model": label}
        row.update({m.removesuffix("_s"): pct(table.loc[m, f"err_{run}"]) for m in ERRORS})
        row["preemptions (engine/sim)"] = f"{int(table.loc['preemptions', 'engine'])}/{int(table.loc['preemptions', run])}"
        row["schedule"] = ("identical" if sched["schedule_identical"]
                           else f"diverges at step {int(sched['first_divergent_step'])}")
        row["step |err| median/P90"] = (f"{100 * table.loc['replay_step_abs_err_median', run]:.1f}% / "
                                        f"{100 * table.loc['replay_step_abs_err_p90', run]:.1f}%")
        row["replayed busy time"] = pct(table.loc["replay_busy_s", f"err_{run}"])
        rows.append(row)
    return rows


def compare_table() -> pd.DataFrame:
    rows = []
    for model, folder in RUNS.items():
        for w in WORKLOADS:
            rows += compare_rows(model, w, folder / f"compare_{w}",
                                 {"profiled": "sim_profiled", "roofline": "sim_roofline"})
            lowo = folder / "lowo" / w / f"compare_{w}"
            if lowo.is_dir():
                rows += compare_rows(model, w, lowo, {"profiled, leave-one-workload-out": "sim_profiled"})
    return pd.DataFrame(rows)


def engine_table() -> pd.DataFrame:
    rows = []
    for model, folder in RUNS.items():
        meta = json.loads((folder / "meta.json").read_text())
        for w in WORKLOADS:
            summary = pd.read_csv(folder / f"compare_{w}" / "engine" / "summary.csv").iloc[0]
            rows.append({"model": model, "workload": w, "overrides": " ".join(meta["stages"][f"compare_{w}"]["overrides"]),
                         "requests": int(summary["num_requests"]), "KV blocks": int(summary["num_blocks"]),
                         "engine out tok/s": f"{summary['output_tok_s']:.0f}", "makespan s": f"{summary['makespan_s']:.1f}",
                         "steps": int(summary["num_steps"])})
    return pd.DataFrame(rows)


def step_kind_table() -> pd.DataFrame:
    """Where the profiled model's time goes wrong: replayed engine steps by kind (compare_steps.csv)."""
    rows = []
    for model, folder in RUNS.items():
        for w in WORKLOADS:
            steps = pd.read_csv(folder / f"compare_{w}" / "compare_steps.csv")
            for kind, part in steps.groupby("kind"):
                measured, predicted = part["measured_execute_s"], part["predicted_execute_profiled_s"]
                host_pred = part["predicted_profiled_s"] - predicted
                rows.append({"model": model, "workload": w, "kind": kind, "steps": len(part),
                             "execute ms, measured mean": f"{1e3 * measured.mean():.2f}",
                             "predicted mean": f"{1e3 * predicted.mean():.2f}",
                             "execute sum err": pct(predicted.sum() / measured.sum() - 1),
                             "host ms, measured mean": f"{1e3 * part['measured_host_s'].mean():.3f}",
                             "host predicted mean": f"{1e3 * host_pred.mean():.3f}"})
    return pd.DataFrame(rows)


def run1_vs_run2() -> pd.DataFrame:
    """The same engine code and workload measured in both calls (Qwen3-0.6B)."""
    rows = []
    for run in ("h100_run1", "h100_run2"):
        for w in ("bench", "azure"):
            folder = HERE / run / "qwen3_0_6b" / f"compare_{w}" / "engine"
            summary = pd.read_csv(folder / "summary.csv").iloc[0]
            steps = pd.read_csv(folder / "steps.csv")
            rows.append({"call": run, "workload": w, "out tok/s": f"{summary['output_tok_s']:.0f}",
                         "TPOT P50 ms": f"{1e3 * summary['tpot_p50_s']:.1f}",
                         "prefill step mean ms": f"{1e3 * steps[steps['kind'] == 'prefill']['duration'].mean():.1f}",
                         "decode step mean ms": f"{1e3 * steps[steps['kind'] == 'decode']['duration'].mean():.2f}",
                         "host stalls > 50 ms": int((steps["host_s"] > 0.05).sum())})
    return pd.DataFrame(rows)


def main() -> int:
    print("## Engine runs (measured)\n")
    print(markdown(engine_table()))
    print("\n## Held-out error of the fit (validation.csv)\n")
    print(markdown(validation_table()))
    print("\n## Simulated vs measured (err = (sim - engine) / engine)\n")
    print(markdown(compare_table()))
    print("\n## Replayed engine steps by kind, profiled model (compare_steps.csv)\n")
    print(markdown(step_kind_table()))
    print("\n## Qwen3-0.6B engine, same code and workload, call 1 vs call 2\n")
    print(markdown(run1_vs_run2()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
