"""Which send path the simulated side of a measure call should price: every committed disaggregated
measure call re-simulated (experiments/disagg/h200_run1/resim.py, aggregated cells too) with the link
alone, with the engine's step-boundary handshake, and with the handshake and each send queued behind
the prefill GPU's step in flight (engine.kv_link.BlockMover); comparisons within target counted per
call, per metric group, for the call's own pricing ("as run") and for its engine's send path.

    python -m experiments.disagg.send_path_choice [--resim-dir DIR] [--out CSV]

DIR keeps each re-simulation (<call>__<variant>.csv; default a scratch folder of the system's temporary
directory); one already there is read, not run again. Writes experiments/disagg/send_path_choice.csv.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import pandas as pd

from experiments.disagg.h200_run1 import resim
from experiments.disagg.tables import TARGETS, runs_path

HERE = Path(__file__).resolve().parent
# the re-simulation's send-path flags per variant
VARIANTS = {"link": ["--no-handshake", "--queue-behind-step", "0"],
            "handshake": ["--queue-behind-step", "0"],
            "handshake+queue": ["--queue-behind-step", "1"]}
BEFORE, MOVER = "host-blocking copies", "BlockMover"
# call folder, the engine's send path when it ran (BlockMover: 28659b2, in main from b4353ce), the
# variant the call priced itself with (settings.json), the variant of its engine's send path
CALLS = (("h200_run1", BEFORE, "link", "handshake"),  # committed 9c12ad4, before 28659b2
         ("h200x4_pd_mixes/measure_1P3D", MOVER, "handshake", "handshake+queue"),  # its --scenarios: 227a066
         ("h200x4_pd_mixes/measure_2P2D", MOVER, "handshake", "handshake+queue"),
         ("h200x4_pd_mixes/measure_3P1D_u08", MOVER, "handshake", "handshake+queue"),
         ("h200x4_pd_mixes/run2/measure_2P2D", MOVER, "handshake", "handshake+queue"),  # main 16b9d75
         ("h200x4_pd_mixes/run2/measure_3P1D", MOVER, "handshake", "handshake+queue"),
         ("h200_8b_run1", MOVER, "handshake", "handshake+queue"))  # main b143c5b
GROUPS = {"ttft": ("ttft_p50_s", "ttft_p90_s"), "tpot": ("tpot_p50_s", "tpot_p90_s"),
          "throughput": ("output_tok_s", "request_s"), "transfer": ("transfer_p50_s",)}
KEYS = ["fleet", "workload", "load"]


def resimulated(call: str, variant: str, folder: Path) -> pd.DataFrame:
    path = folder / f"{call.replace('/', '_')}__{variant}.csv"
    if not path.is_file():
        resim.main(["--run", str(HERE / call), "--aggregated", *VARIANTS[variant], "--out", str(path)])
    return pd.read_csv(path, dtype={"load": str})


def count(call: str, sim: pd.DataFrame) -> dict[str, int]:
    """Comparisons within target of sim against the call's measured rows, per group and fleet kind."""
    runs = pd.read_csv(runs_path(HERE / call), dtype={"load": str})
    both = runs[runs.side == "measured"].merge(sim, on=KEYS, suffixes=("", "_sim"))
    out: dict[str, int] = {}
    for _, row in both.iterrows():
        kind = "disagg" if row.fleet[0].isdigit() and "P" in row.fleet else "agg"
        for group, metrics in GROUPS.items():
            for metric in metrics:
                m, s = row[metric], row[f"{metric}_sim"]
                if not (math.isfinite(m) and math.isfinite(s)) or m == 0:
                    continue
                hit = int(abs(s / m - 1) <= TARGETS[metric])
                for key in ("all", kind, f"{kind}_{group}"):
                    out[f"{key}_within"] = out.get(f"{key}_within", 0) + hit
                    out[f"{key}_of"] = out.get(f"{key}_of", 0) + 1
    return out


def reproduction(call: str, sim: pd.DataFrame) -> float:
    """Largest relative difference, %, between the re-simulation and the call's own simulated rows."""
    runs = pd.read_csv(runs_path(HERE / call), dtype={"load": str})
    both = runs[runs.side == "profiled"].merge(sim, on=KEYS, suffixes=("", "_sim"))
    diffs = [abs(row[f"{m}_sim"] / row[m] - 1) for _, row in both.iterrows() for m in TARGETS
             if math.isfinite(row[m]) and row[m] != 0 and math.isfinite(row[f"{m}_sim"])]
    return round(100 * max(diffs), 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resim-dir", type=Path, default=Path(tempfile.gettempdir()) / "send_path_choice")
    parser.add_argument("--out", type=Path, default=HERE / "send_path_choice.csv")
    args = parser.parse_args(argv)
    args.resim_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for call, engine, as_run, own in CALLS:
        for variant in VARIANTS:
            sim = resimulated(call, variant, args.resim_dir)
            role = "+".join(r for r, v in (("as run", as_run), ("engine's own", own)) if v == variant)
            rows.append({"call": call, "engine_send": engine, "variant": variant, "role": role,
                         "repro_max_diff_pct": reproduction(call, sim) if variant == as_run else math.nan,
                         **count(call, sim)})
    table = pd.DataFrame(rows)
    counts = [c for c in table.columns if c.endswith(("_within", "_of"))]
    totals = [{"call": "ALL", "variant": label, **table[pick][counts].sum().to_dict()}
              for label, pick in (("as run", table.role.str.contains("as run")),
                                  ("engine's own", table.role.str.contains("engine's own")),
                                  *((v, table.variant == v) for v in VARIANTS))]
    table = pd.concat([table, pd.DataFrame(totals)], ignore_index=True)
    table.to_csv(args.out, index=False)
    show = ["call", "variant", "role", "all_within", "all_of", "disagg_within", "disagg_of", "repro_max_diff_pct"]
    print(table[show].to_string(index=False))


if __name__ == "__main__":
    main()
