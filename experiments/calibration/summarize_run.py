"""Tables of a calibration run (run 3: async engine, overlap-priced profiled model; run 4: the
same with prefill CUDA graphs; run 5: the same with balanced decode splits; run 6: the same with
prefill graphs priced by device time), from its folders.

  python experiments/calibration/summarize_run.py h100_run6 > experiments/calibration/results_run6.md
  python experiments/calibration/summarize_run.py h100_run5 repriced > experiments/calibration/results_run5_repriced.md

Runs 3-5 (and run 5's folders that run 6's repeatability table reads) left the tree: check out
commit e869d52 first (experiments/calibration/README.md, "What the run folders keep").

A second argument reads each model's <sub-folder>/ instead: the same engine runs compared again
without a GPU (refit.py for validation.csv, recompare.py for compare_*/) after a change of the
simulator's pricing.

Nothing is measured here. Per model: simulated vs measured on each target workload, the held-out
errors of the fit, then where the run has them (qwen3_8b_repeat/) the engine's own repeatability:
the online workloads served again (repeat_h100.sh, fresh processes, same seeds) against the same
simulated runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.scripting import require

ROOT = Path(__file__).resolve().parent
MODELS = {"Qwen3-0.6B": "qwen3_0_6b", "Qwen3-8B": "qwen3_8b"}
METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


def pct(value: float) -> str:
    return f"{100 * value:+.1f}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def read(path: Path) -> pd.DataFrame:
    return pd.read_csv(require(path))


def comparison(run: Path, sub: str) -> str:
    rows = []
    for label, folder in MODELS.items():
        for workload in ("bench", "poisson", "azure"):
            path = run / folder / sub / f"compare_{workload}"
            if not (path / "compare.csv").is_file():
                continue
            frame = read(path / "compare.csv").set_index("metric")
            schedule = pd.read_csv(path / "compare_schedule.csv").set_index("run")
            for model in ("profiled", "roofline"):
                same = bool(schedule.loc[f"sim_{model}", "schedule_identical"])
                first = int(schedule.loc[f"sim_{model}", "first_divergent_step"])
                rows.append([label, workload, model, *[pct(frame.loc[m, f"err_sim_{model}"]) for m in METRICS],
                             "identical" if same else f"diverges at {first}"])
    return table(["model", "workload", "cost model", "output tok/s", "TTFT P50", "TTFT P90", "TPOT P50", "TPOT P90",
                  "schedule"], rows)


def validation(run: Path, sub: str) -> str:
    rows = []
    for label, folder in MODELS.items():
        frame = read(run / folder / sub / "validation.csv")
        for _, r in frame[frame.regime == "all"].iterrows():
            rows.append([label, r["set"], str(int(r["steps"])), pct(r["median_abs_rel_error"]).lstrip("+"),
                         pct(r["p90_abs_rel_error"]).lstrip("+"), pct(r["sum_rel_error"])])
    return table(["model", "held-out set", "steps", "median abs err", "P90 abs err", "error of the sum"], rows)


# Earlier runs whose engine code was the same as this run's: their engine runs are repeats too.
SAME_ENGINE = {"h100_run6": ("h100_run5",)}


def repeatability(run: Path, folder: str) -> str:
    """The model's online engine percentiles over this run, its repeats (<folder>_repeat/, one
    device call after the calibration call) and SAME_ENGINE runs, against this run's simulator."""
    rows = []
    repeats = sorted(p.name.rsplit("_r", 1)[1] for p in (run / f"{folder}_repeat").glob("compare_poisson_r*")
                     if p.is_dir())
    for workload in ("poisson", "azure"):
        runs = {"calibration call": run / folder / f"compare_{workload}"}
        runs.update({f"{other.replace('h100_run', 'run ')} call": ROOT / other / folder / f"compare_{workload}"
                     for other in SAME_ENGINE.get(run.name, ())})
        runs.update({f"repeat {r}": run / f"{folder}_repeat" / f"compare_{workload}_r{r}" for r in repeats})
        values = {name: read(path / "compare.csv").set_index("metric").loc[list(METRICS), "engine"]
                  for name, path in runs.items()}
        sim = read(runs["calibration call"] / "compare.csv").set_index("metric").loc[list(METRICS), "sim_profiled"]
        engine = pd.DataFrame(values)
        for metric in METRICS:
            spread = engine.loc[metric].max() / engine.loc[metric].min() - 1
            scale = 1e3 if metric != "output_tok_s" else 1.0
            fmt = (lambda v: f"{v * scale:.2f}") if scale != 1 else (lambda v: f"{v:,.0f}")
            rows.append([workload, metric, *[fmt(v) for v in engine.loc[metric]], f"{100 * spread:.0f}%",
                         fmt(sim[metric]), pct(sim[metric] / engine.loc[metric].mean() - 1)])
    return table(["workload", "metric (ms or tok/s)", *[f"engine: {name}" for name in runs],
                  "engine max/min - 1", "sim (profiled)", "sim vs engine mean"], rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="run folder under experiments/calibration/, e.g. h100_run6")
    parser.add_argument("sub", nargs="?", default="", help="each model's sub-folder to read instead (e.g. repriced)")
    args = parser.parse_args(argv)
    run, sub = require(ROOT / args.run), args.sub
    title = args.run.replace("h100_", "").replace("run", "run ") + (f", {sub}" if sub else "")
    source = f"{args.run}/" + (f"<model>/{sub}/" if sub else "")
    tables = [comparison(run, sub), validation(run, sub)]
    tables += [repeatability(run, folder) for folder in MODELS.values() if (run / f"{folder}_repeat").is_dir()]
    print(f"# Calibration {title}: tables\n")
    command = f"python experiments/calibration/summarize_run.py {args.run} {sub}".rstrip()
    print(f"Generated by `{command}` from `{source}`.\n")
    print("## Simulated vs measured, err = (sim - engine) / engine\n")
    print(tables[0] + "\n")
    print("## Held-out error of the fit, per step\n")
    print(tables[1] + "\n")
    for label, table_text in zip([lb for lb, f in MODELS.items() if (run / f"{f}_repeat").is_dir()], tables[2:]):
        print(f"## {label}: the engine's own run-to-run spread on the online workloads\n")
        print("Same workload, seeds and fitted model, the engine in a fresh process each time "
              "(`repeat_h100.sh`, one device call after the calibration call; the simulated runs are deterministic).\n")
        print(table_text + "\n")


if __name__ == "__main__":
    main()
