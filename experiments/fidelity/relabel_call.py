"""A device call's held-out tables (heldout.csv, schedules.csv) with the GPU it really ran on: a call
that asked for one kind of GPU and was lent another labels its rows with the conf/hardware it was
told, and its simulated columns are that GPU's cost models. The engine's values are kept; the
hardware column becomes the GPU named here and each cost model is renamed as told, so no row
claims a prediction for a GPU it did not price. No GPU needed.

    python experiments/fidelity/relabel_call.py <call>/qwen3-0.6b/code_completion \
        --hardware h200 --rename profiled=h100_fit_uncarried roofline=roofline_h100 \
        --out experiments/fidelity/code_completion_h200/qwen3-0.6b
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.convert import ConfigError
from harness.scripting import compose_run_config, one_line_errors

TABLES = ("heldout.csv", "schedules.csv")


def renames(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ConfigError(f"--rename: expected OLD=NEW, got {pair!r}")
        out[old] = new
    return out


def relabel(table: pd.DataFrame, hardware: str, rename: dict[str, str]) -> pd.DataFrame:
    """table with every row's hardware set to `hardware` and cost models renamed; engine columns kept."""
    out = table.assign(hardware=hardware)
    if "cost_model" in out.columns:
        out["cost_model"] = out["cost_model"].replace(rename)
    if "engine_repeats" in out.columns and "engine_calls" not in out.columns:
        out["engine_calls"] = 1  # one call: as merge.py's pooled tables count them
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("call", type=Path, help="a call's result folder (<OUT>/<model>/<tag>)")
    parser.add_argument("--hardware", required=True, help="conf/hardware name of the GPU the call ran on")
    parser.add_argument("--rename", nargs="*", default=[], help="cost model renames, OLD=NEW")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def run() -> int:
        hardware = compose_run_config([f"hardware={args.hardware}"]).hardware.name
        rename = renames(args.rename)
        found = [args.call / name for name in TABLES if (args.call / name).is_file()]
        if not found:
            raise ConfigError(f"call: {args.call} holds none of {', '.join(TABLES)}")
        args.out.mkdir(parents=True, exist_ok=True)
        for path in found:
            relabel(pd.read_csv(path), hardware, rename).to_csv(args.out / path.name, index=False)
            print(f"{path} -> {args.out / path.name} ({hardware})")
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
