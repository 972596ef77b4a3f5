"""Summaries as text, and `python -m harness.report DIR...`: many runs into one table and plot.

The report walks each DIR for summary.csv files (single runs, Hydra multirun job folders, sweep
points) and sweep.csv files (of sweeps that wrote no points), stacks their rows with the run folder
as `run`, writes report.csv and report.png (chosen metrics per run) into --out, and prints the
table. A study that did not finish is named before the table, and its rows say so in the `status`
column: a run folder marked INTERRUPTED (harness.run_folder), or a Hydra multirun whose job folders
are fewer than its swept overrides ask for (harness.report_status).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from harness.report_status import run_status, staging, unfinished_multirun_roots, unfinished_studies

TABLE_COLUMNS = (
    "output_tok_s", "total_tok_s", "request_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s",
    "e2e_p90_s", "preemptions", "recomputed_tokens", "prefix_hit_rate", "num_blocks", "makespan_s",
)
REPORT_METRICS = ("output_tok_s", "ttft_p90_s", "tpot_p90_s", "preemptions")


def format_summary(row: dict) -> str:
    """The console summary of one run."""
    lines = [
        f"{row.get('backend', '?')} | model {row.get('model', '?')} | hardware {row.get('hardware', '?')} | "
        f"policy {row.get('policy', '?')} | workload {row.get('workload', '?')}",
        f"requests {row['num_requests']} served, {row.get('num_rejected', 0)} rejected, "
        f"{_clipped(row)}, {row.get('num_skipped', 0)} skipped | "
        f"makespan {row['makespan_s']:.3f} s | {row['num_steps']} steps | {row['num_blocks']} KV blocks",
        f"throughput  in {row['input_tok_s']:,.1f} tok/s | out {row['output_tok_s']:,.1f} tok/s | "
        f"total {row['total_tok_s']:,.1f} tok/s | {row['request_s']:.3f} req/s",
    ]
    # seconds, as in summary.csv (ttft_p90_s, ...) and the plots
    latency = pd.DataFrame(
        {f"{stat} (s)": [row[f"{m}_{stat}_s"] for m in ("ttft", "tpot", "e2e")]
         for stat in ("mean", "p50", "p90", "p99")},
        index=["TTFT", "TPOT", "E2E"],
    )
    lines.append(latency.to_string(float_format=lambda v: f"{v:.5f}"))
    if row.get("interval_level") is not None:
        lines.append(_interval_line(row))
    lines.append(
        f"preemptions {row['preemptions']} | recomputed tokens {row['recomputed_tokens']} | "
        f"prefix hit rate {100 * row['prefix_hit_rate']:.1f}% ({row['cached_tokens']} cached tokens)"
    )
    return "\n".join(lines)


def _interval_line(row: dict) -> str:
    """The prediction interval of each latency percentile that has one (sim.interval), in seconds."""
    bounds = [f"{name} {stat.upper()} [{row[f'{metric}_lo']:.5f}, {row[f'{metric}_hi']:.5f}]"
              for name, prefix in (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")) for stat in ("p50", "p90")
              if (metric := f"{prefix}_{stat}_s") and f"{metric}_lo" in row]
    return f"{100 * float(row['interval_level']):.0f}% interval (s): " + " | ".join(bounds)


def _clipped(row: dict) -> str:
    text = f"{row.get('num_clipped', 0)} clipped"
    if row.get("num_clipped"):
        text += (f" ({row['num_prompts_clipped']} prompts lost {row['prompt_tokens_clipped']} tokens, "
                 f"{row['num_outputs_clipped']} outputs lost {row['output_tokens_clipped']} tokens)")
    return text


def format_table(table: pd.DataFrame, keys: list[str]) -> str:
    columns = [c for c in keys + list(TABLE_COLUMNS) if c in table.columns]
    return table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def collect(dirs: list[Path]) -> pd.DataFrame:
    """One row per run under dirs. A sweep whose points were written (points/*/summary.csv) is read
    from those; its sweep.csv only when it kept no point outputs. A folder given twice counts once."""
    summaries: dict[Path, Path] = {}  # resolved -> as found (run labels keep the user's spelling)
    sweeps: dict[Path, Path] = {}
    for root in dirs:
        if not root.exists():
            raise FileNotFoundError(f"{root}: no such run directory")
        for path in sorted(root.rglob("summary.csv")):
            if not staging(path):
                summaries.setdefault(path.resolve(), path)
        for path in sorted(root.rglob("sweep.csv")):
            if not staging(path) and not (path.parent / "points").is_dir():
                sweeps.setdefault(path.resolve(), path)
    frames = []
    unfinished = unfinished_multirun_roots(dirs)
    for path in summaries.values():
        frame = pd.read_csv(path)
        frame.insert(0, "run", str(path.parent))
        frame.insert(1, "status", run_status(path.parent, unfinished))
        frames.append(frame)
    for path in sweeps.values():
        frame = pd.read_csv(path)
        frame.insert(0, "run", [f"{path.parent}[{p}={v}]" for p, v in zip(frame["param"], frame["value"])])
        frame.insert(1, "status", run_status(path.parent, unfinished))
        frames.append(frame.drop(columns=["param", "value"]))
    if not frames:
        raise FileNotFoundError(f"no summary.csv or sweep.csv under {[str(d) for d in dirs]}")
    return pd.concat(frames, ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run, multirun or experiment output folders")
    parser.add_argument("--out", type=Path, default=Path("."), help="where report.csv and report.png go")
    parser.add_argument("--metrics", nargs="+", default=list(REPORT_METRICS), help="columns to plot")
    args = parser.parse_args(argv)
    try:
        table = collect(args.dirs)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    unfinished = unfinished_studies(args.dirs)
    for line in unfinished:
        print(f"INCOMPLETE: {line}")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "report.csv", index=False)
    from harness.output.plots import plot_sweep

    common = os.path.commonpath(list(table["run"])) if len(table) > 1 else ""
    table["label"] = [os.path.relpath(r, common) if common else Path(r).name for r in table["run"]]
    title = "Report" + (" (INCOMPLETE: see status)" if unfinished else "")
    plot_sweep(table, "label", tuple(args.metrics), args.out / "report.png", xlabel="run", title=title)
    print(format_table(table, ["label", "status", "backend", "policy", "workload"]))
    if unfinished:
        print(f"{len(unfinished)} stud{'y' if len(unfinished) == 1 else 'ies'} did not finish (listed above)")
    print(f"wrote {args.out / 'report.csv'} and {args.out / 'report.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
