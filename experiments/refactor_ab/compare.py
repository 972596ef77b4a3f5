"""Compare the tables two refactor_ab runs wrote: every CSV present in both, cell by cell.

    python experiments/refactor_ab/compare.py BEFORE AFTER

Columns that time the harness itself (eval_s, wall_s: seconds taken on this machine) are
left out; everything a user reads as a result must be equal. Exits 1 and lists the differences.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

# wall-clock timings of the tool, not results
TIMING_COLUMNS = {"eval_s", "wall_s"}


def differences(before: Path, after: Path) -> list[str]:
    problems = []
    reused = set((after / "REUSED").read_text().split()) if (after / "REUSED").exists() else set()
    names = sorted(p.relative_to(before) for p in before.rglob("*.csv*") if str(p.relative_to(before)) not in reused)
    for name in names:
        other = after / name
        if not other.exists():
            problems.append(f"{name}: missing after")
            continue
        a, b = pd.read_csv(before / name), pd.read_csv(other)
        a = a.drop(columns=[c for c in a.columns if c in TIMING_COLUMNS])
        b = b.drop(columns=[c for c in b.columns if c in TIMING_COLUMNS])
        if list(a.columns) != list(b.columns):
            problems.append(f"{name}: columns differ: {sorted(set(a.columns) ^ set(b.columns))}")
            continue
        if a.shape != b.shape:
            problems.append(f"{name}: shape {a.shape} -> {b.shape}")
            continue
        unequal = [c for c in a.columns if not a[c].equals(b[c])]
        if unequal:
            problems.append(f"{name}: columns {unequal} differ")
    return problems


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    problems = differences(args.before, args.after)
    reused = args.after / "REUSED"
    count = len(list(args.before.rglob("*.csv*"))) - (len(reused.read_text().split()) if reused.exists() else 0)
    if problems:
        print("\n".join(problems))
        print(f"{len(problems)} of {count} tables differ")
        sys.exit(1)
    print(f"all {count} tables equal")


if __name__ == "__main__":
    main()
