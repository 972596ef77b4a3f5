"""A measure call's cells priced again at the host each was served on, in the call, once it has served.

The serving host's speed is read off the engine replicas' recorded launches (fleet_hosts.py: the
decode replicas' graph launches against the profile's launch fit), so it is known only after the
host has served: compare.md keeps the prediction made before, and compare_hosts.md adds the one at
each cell's measured host. Three calls on three pairs of H200s found it moving the loaded cells
toward the engine (runs 4, 7 and 8: 56 -> 59, 60 -> 65 of 78 and 29 -> 32 of 39 within target;
docs/disaggregation.md). `run_disagg measure --keep-steps` runs it after its last cell; on a call's
folder afterwards (its bundle unpacked):

    python -m experiments.disagg.measured_hosts DIR

Writes into DIR: hosts.csv (fleet_hosts.py), resim_hosts.csv (h200_run1/resim.py --hosts) and
compare_hosts.md (compare.md's layout, the side "at measured host"); where no host can be read
(no recorded launches, no profile), compare_hosts.md says why in one line and nothing else changes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from experiments.disagg.fleet_hosts import call_profile_path, fleet_hosts
from experiments.disagg.h200_run1 import resim
from experiments.disagg.tables import KEYS, compare_rows, error_table, runs_path

SIDE = "at measured host"
OUTPUT = "compare_hosts.md"
ESTIMATE_S = 60.0  # re-simulating a call's cells on its host's CPU: ~10 s for Qwen3-0.6B's six, more for the 8B


def price_at_measured_hosts(out: Path, trace: str | None = None) -> str:
    """Write hosts.csv, resim_hosts.csv and compare_hosts.md into a measure call's folder; return the
    latter's text. Raises SystemExit or OSError where the call cannot be priced so (see priced_or_why)."""
    profile = call_profile_path(out)
    hosts = fleet_hosts(out, profile)
    hosts.to_csv(out / "hosts.csv", index=False, float_format="%.4f")
    argv = ["--run", str(out), "--aggregated", "--hosts", str(out / "hosts.csv"), "--profile", str(profile),
            "--label", "hosts", "--out", str(out / "resim_hosts.csv")]
    resim.main(argv + (["--trace", trace] if trace else []))
    text = error_table(host_rows(out))
    (out / OUTPUT).write_text(text)
    return text


def priced_or_why(out: Path, trace: str | None = None) -> str:
    """price_at_measured_hosts, or a one-line compare_hosts.md saying why not: the measured cells
    and compare.md stay as they are either way."""
    try:
        return price_at_measured_hosts(out, trace)
    except (SystemExit, OSError, KeyError, ValueError) as error:
        reason = str(error).removeprefix("error: ")
        text = f"Not priced at the measured host: {reason}\n"
        (out / OUTPUT).write_text(text)
        return text


def host_rows(out: Path) -> pd.DataFrame:
    """resim_hosts.csv as compare.csv's rows (error_table's input): each cell's simulated metric at
    its measured host against the measured run of runs.csv."""
    priced = pd.read_csv(out / "resim_hosts.csv", dtype={"load": str})
    runs = pd.read_csv(runs_path(out), dtype={"load": str})
    measured = runs[runs["side"] == "measured"].set_index(list(KEYS))
    rows = []
    for cell in priced.to_dict("records"):
        run = measured.loc[tuple(cell[k] for k in KEYS)]
        keys = {**{k: cell[k] for k in KEYS}, "rate_req_s": run["rate_req_s"], "num_requests": run["num_requests"]}
        rows += compare_rows(keys, run.to_dict(), cell, SIDE)
    if not rows:
        raise ValueError(f"{out / 'resim_hosts.csv'} has no cell that runs.csv measured")
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a measure call's folder (runs.csv, settings.json, steps_*.csv.gz)")
    parser.add_argument("--trace", default=None, help="the Azure conversation trace (default: resim's)")
    args = parser.parse_args(argv)
    text = priced_or_why(args.run, args.trace)
    print(text)
    return 0 if not text.startswith("Not priced") else 1


if __name__ == "__main__":
    sys.exit(main())
