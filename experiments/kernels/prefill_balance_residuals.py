"""Where the prefill balance probe's model misses (experiments/kernels/prefill_balance_h200/README.md):
its fit with the term's rate free ("probe"), fixed at a grid fit's ("grid"), and with two more terms
("+waves": programs per slot, all sequences' cached keys), relative error per shape.

    python -m experiments.kernels.prefill_balance_residuals KERNEL_CSV --seconds-per-key 2.40e-8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

SLOTS = 264  # 132 SMs x 2 programs an SM (the probe's H100/H200 figures)
MODELS = {"probe": ("even_keys", "excess_keys"), "+waves": ("even_keys", "excess_keys", "waves", "context_k")}



def error_stats(error) -> dict[str, float]:
    """Median, 90th percentile and largest absolute relative error of a model on the probe's rows."""
    size = np.abs(np.asarray(error, dtype=float))
    return {"median_abs": float(np.median(size)), "p90_abs": float(np.quantile(size, 0.9)),
            "max_abs": float(size.max())}

def fit(part: pd.DataFrame, columns: tuple[str, ...],
        fixed_us_per_key: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients (c0, then the free columns) and relative errors; excess_keys priced at
    fixed_us_per_key where given."""
    y = part["us"].to_numpy()
    free = [c for c in columns if not (fixed_us_per_key is not None and c == "excess_keys")]
    x = np.column_stack([np.ones(len(y))] + [part[c].to_numpy() for c in free])
    fixed = part["excess_keys"].to_numpy() * fixed_us_per_key if fixed_us_per_key is not None else np.zeros(len(y))
    coef, *_ = np.linalg.lstsq(x / y[:, None], 1 - fixed / y, rcond=None)
    return coef, (x @ coef + fixed) / y - 1


def residuals(kernel: pd.DataFrame, seconds_per_key: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(a row per shape and launch with each model's relative error; a summary row per launch and model)."""
    kernel = kernel.assign(waves=kernel["programs"] / SLOTS, context_k=kernel["seqs"] * kernel["cached"] / 1e3)
    rows, summary = [], []
    for launch, part in kernel.groupby("launch"):
        part = part.copy()
        for name, columns, fixed in (("probe", MODELS["probe"], None), ("grid", MODELS["probe"], seconds_per_key * 1e6),
                                     ("+waves", MODELS["+waves"], None)):
            coef, error = fit(part, columns, fixed)
            part[name] = error
            per_key = fixed if fixed is not None else coef[1 + columns.index("excess_keys")]
            summary.append({"launch": launch, "model": name, "seconds_per_key": per_key * 1e-6,
                            **error_stats(error)})
        rows.append(part)
    return pd.concat(rows), pd.DataFrame(summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", type=Path, help="a probe's kernel.csv (or .csv.gz)")
    parser.add_argument("--seconds-per-key", type=float, default=2.40e-8,
                        help="a grid fit's prefill_program_keys coefficient")
    parser.add_argument("--worst", type=int, default=12, help="shapes to list, worst under the probe's own fit")
    parser.add_argument("--shapes", default="", help="graph-launch shapes to list too: seqs/chunk/cached,...")
    args = parser.parse_args(argv)
    if not args.seconds_per_key > 0:
        raise SystemExit(f"error: --seconds-per-key must be > 0, got {args.seconds_per_key}")
    table, summary = residuals(pd.read_csv(args.kernel), args.seconds_per_key)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    worst = table.reindex(table["probe"].abs().sort_values(ascending=False).index).head(args.worst)
    try:
        picked = [tuple(int(v) for v in shape.split("/")) for shape in args.shapes.split(",") if shape]
    except ValueError:
        raise SystemExit(f"error: --shapes takes seqs/chunk/cached,... (integers), got {args.shapes!r}") from None
    graph = table[table["launch"] == "graph"].set_index(["seqs", "chunk", "cached"], drop=False)
    worst = pd.concat([worst, graph.loc[[s for s in picked if s in graph.index]]])
    print(worst[["launch", "seqs", "chunk", "cached", "programs", "excess_keys", "us", "probe", "grid", "+waves"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
