"""A landed request's write into a disaggregated decode replica's cache (backend.kv_scatter): measured
from measure calls' kept steps, fitted, and weighed on every committed call.

    python -m experiments.disagg.kv_scatter gaps BUNDLE_DIR ... --out landing_gaps.csv
    python -m experiments.disagg.kv_scatter fit landing_gaps.csv
    python -m experiments.disagg.kv_scatter weigh [--resim-dir DIR] --out kv_scatter_weighed.csv

gaps: in each call's kept steps (run_disagg measure --keep-steps; BUNDLE_DIR holds steps_*.csv.gz,
runs.csv and settings.json), the measured decode replica's idle time before each step within a busy
period (under 5 ms), by how many requests the step admitted beyond the one before (its batch's
growth: landed requests), with the cell's mean prompt and the model's KV bytes per token. The engine
writes each landed request's KV from its staging into the cache on the compute stream before the next
step (engine.kv_link.BlockMover.scatter), which the device's gap shows.
fit: base + bytes / bandwidth over the cells' median gap of one landing (conf/hardware's
kv_scatter_base_s, kv_scatter_bandwidth).
weigh: every committed call re-simulated (h200_run1.resim, aggregated cells too, each with its engine's
send path) with the fleet intake and the idle start, without and with the write: comparisons within
target per call and metric group (send_path_choice.count).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg import send_path_choice as spc
from experiments.disagg.h200_run1 import resim
from experiments.disagg.kept_steps import read_kept
from experiments.disagg.tables import runs_path
from harness.scripting import compose_run_config

HERE = Path(__file__).resolve().parent
BUSY_S = 5e-3  # a longer gap is an idle replica waiting for work, not a write
SETTINGS = ["--set", "backend.fleet_intake=true", "--set", "backend.idle_start=true"]
VARIANTS = {"intake+idle": SETTINGS, "intake+idle+scatter": [*SETTINGS, "--set", "backend.kv_scatter=true"]}
# every committed measure call, with its engine's send path; the two the figures were measured on last
CALLS = tuple((call, own) for call, _, _, own in spc.CALLS) + (
    ("h200_06b_run2", "handshake+queue"), ("h200_06b_run3", "handshake+queue"), ("h200_8b_run2", "handshake+queue"),
    ("h200_06b_run4", "handshake+queue"), ("h200_8b_run3", "handshake+queue"))
MEASURED_ON = ("h200_06b_run4", "h200_8b_run3")


def cell_gaps(bundle: Path) -> pd.DataFrame:
    """Per 1P1D cell and landed count (1, 2, 3+): steps and their median idle gap before the step."""
    model = json.loads((bundle / "settings.json").read_text())["args"]["model"]
    spec = compose_run_config([f"model={model}"]).model
    runs = pd.read_csv(runs_path(bundle), dtype={"load": str})
    rows = []
    for path in sorted(bundle.glob("steps_1P1D_*.csv.gz")):
        kept = read_kept(path)
        steps = kept[(kept.side == "measured") & (kept.pool == "decode")].sort_values("start")
        gap = (steps.start - (steps.start + steps.duration).shift(1)).to_numpy()[1:]
        landed = np.clip(np.diff(steps.requests.to_numpy()), 0, 3)
        run = runs[(runs.side == "measured") & (runs.fleet == "1P1D") & (runs.workload == kept.workload.iloc[0])
                   & (runs.load == kept.load.iloc[0])].iloc[0]
        for k in (1, 2, 3):
            chosen = gap[(landed == k) & (gap < BUSY_S)]
            rows.append({"model": model, "workload": kept.workload.iloc[0], "load": kept.load.iloc[0], "landed": k,
                         "steps": len(chosen), "gap_p50_s": float(np.median(chosen)) if len(chosen) else np.nan,
                         "prompt_mean": run.input_tokens / run.num_requests,
                         "kv_bytes_per_token": spec.kv_bytes_per_token_per_rank(1)})
    return pd.DataFrame(rows)


def fit(gaps: pd.DataFrame) -> tuple[float, float]:
    """(base seconds, bandwidth in bytes/s) of one landing's gap against its request's KV bytes."""
    one = gaps[(gaps.landed == 1) & (gaps.steps >= 20) & (gaps.load != "offline")]
    kv_bytes = one.prompt_mean * one.kv_bytes_per_token
    slope, base = np.polyfit(kv_bytes, one.gap_p50_s, 1)
    return float(base), float(1 / slope)


def weigh(resim_dir: Path, variants: dict[str, list[str]] = VARIANTS,
          calls_weighed: tuple[tuple[str, str], ...] = CALLS) -> pd.DataFrame:
    """Per call (with its engine's send path) and variant (its resim flags), the comparisons within
    target by metric group, then totals over the calls held out of MEASURED_ON and over all; each
    re-simulation is kept in resim_dir and reused."""
    rows = []
    for call, own in calls_weighed:
        for variant, flags in variants.items():
            path = resim_dir / f"{call.replace('/', '_')}__{variant}.csv"
            if not path.is_file():
                resim.main(["--run", str(HERE / call), "--aggregated", *spc.VARIANTS[own], *flags, "--out", str(path)])
            sim = pd.read_csv(path, dtype={"load": str})
            rows.append({"call": call, "fitted_on": call in MEASURED_ON, "variant": variant, **spc.count(call, sim)})
    calls = pd.DataFrame(rows).fillna(0)
    counts = [c for c in calls.columns if c.endswith(("_within", "_of"))]
    totals = []
    for label, chosen in (("ALL held out", calls[~calls.fitted_on]), ("ALL", calls)):
        for variant in variants:
            totals.append({"call": label, "fitted_on": label == "ALL", "variant": variant,
                           **chosen[chosen.variant == variant][counts].sum().to_dict()})
    return pd.concat([calls, pd.DataFrame(totals)], ignore_index=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("gaps", "fit", "weigh"))
    parser.add_argument("paths", nargs="*", type=Path, help="gaps: bundle folders; fit: the gaps CSV")
    parser.add_argument("--resim-dir", type=Path, default=Path(tempfile.gettempdir()) / "kv_scatter")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command in ("gaps", "fit") and not args.paths:
        parser.error(f"{args.command} needs paths")
    if args.command == "gaps":
        table = pd.concat([cell_gaps(p) for p in args.paths], ignore_index=True)
    elif args.command == "fit":
        base, bandwidth = fit(pd.read_csv(args.paths[0], dtype={"load": str}))
        print(f"kv_scatter_base_s: {base:.4g}\nkv_scatter_bandwidth: {bandwidth:.4g}")
        return 0
    else:
        args.resim_dir.mkdir(parents=True, exist_ok=True)
        table = weigh(args.resim_dir)
    print(table.to_string(index=False))
    if args.out is not None:
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
