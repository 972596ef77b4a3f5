"""The prefill balance probe's kernel times (experiments/kernels/prefill_balance_h200) against the
cached context's K/V bytes (sim.prefill_programs, PREFILL_CACHED_KV_BYTES), added two ways to the
probe's model (c0 + w x keys / slots + excess keys / rate + p x programs / slots):

  sum     + b x GB read: a linear feature, as the profiled fits take it
  floor   max(the probe's model, a + GB / bandwidth): the attention waits on HBM at least

GB: the cached tokens of all sequences x K and V of a token in one layer (--kv-bytes, Qwen3-0.6B's
8 KV heads x 128 x 2 x 2 bytes). Least squares on relative error per launch; prints each model's
errors, the rate of the bytes (TB/s), and the HBM-bound shapes (--shapes).

    python -m experiments.kernels.prefill_kv_bytes experiments/kernels/prefill_balance_h200/kernel.csv.gz
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.kernels.prefill_balance_residuals import error_stats

SLOTS = 264  # 132 SMs x 2 programs an SM (the probe's H100/H200 figures)
KV_BYTES = 8 * 128 * 2 * 2  # one cached token's K and V in one layer, Qwen3-0.6B, bf16
MODELS = ("programs", "sum", "floor")
ERRORS = tuple(f"{model}_error" for model in MODELS)  # relative error columns (not the kernel's `programs`)
HBM_SHAPES = "32/16/2048,32/16/8192,64/16/2048,64/16/8192"


def least_squares(residual: Callable[[np.ndarray], np.ndarray], start: np.ndarray, iters: int = 400) -> np.ndarray:
    """Levenberg-Marquardt with a forward-difference Jacobian (no scipy in the project's deps)."""
    p, damping = start.astype(float), 1e-3
    cost = float(np.sum(residual(p) ** 2))
    for _ in range(iters):
        r = residual(p)
        jac = np.column_stack([(residual(p + step) - r) / step[i]
                               for i, step in enumerate(np.diag(1e-6 * np.maximum(1.0, np.abs(p))))])
        a, g = jac.T @ jac, jac.T @ r
        while damping < 1e12:
            trial = p + np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -g)
            trial_cost = float(np.sum(residual(trial) ** 2))
            if trial_cost < cost:
                p, cost, damping = trial, trial_cost, damping / 3
                break
            damping *= 5
        else:
            break
    return p


def fit(part: pd.DataFrame, model: str) -> tuple[np.ndarray, np.ndarray]:
    """(parameters, relative errors) of one model on one launch's rows (us, GB as columns)."""
    y = part["us"].to_numpy()
    x = np.column_stack([np.ones(len(y)), part["even_keys"], part["excess_keys"], part["programs"] / SLOTS])
    gb = part["gb"].to_numpy()
    base = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)[0]
    if model == "programs":
        return base, x @ base / y - 1
    if model == "sum":  # linear: least squares as it is
        xs = np.column_stack([x, gb])
        coef = np.linalg.lstsq(xs / y[:, None], np.ones(len(y)), rcond=None)[0]
        return coef, xs @ coef / y - 1

    def price(p: np.ndarray) -> np.ndarray:
        floor: np.ndarray = np.maximum(x @ p[:4], p[4] + p[5] * gb)
        return floor
    p = least_squares(lambda q: price(q) / y - 1, np.r_[base, 5.0, 250.0])  # 250 us a GB: 4 TB/s
    return p, price(p) / y - 1


def compare(kernel: pd.DataFrame, kv_bytes: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(a row per shape and launch with each model's relative error; a summary row per launch and model)."""
    kernel = kernel.assign(gb=kernel["seqs"] * kernel["cached"] * kv_bytes / 1e9)
    rows, summary = [], []
    for launch, part in kernel.groupby("launch"):
        part = part.copy()
        for model in MODELS:
            p, error = fit(part, model)
            part[f"{model}_error"] = error
            tbps = 1e3 / p[-1] if model != "programs" and p[-1] > 0 else float("nan")  # us per GB -> TB/s
            summary.append({"launch": launch, "model": model, "kv_TB_per_s": tbps, **error_stats(error)})
        rows.append(part)
    return pd.concat(rows), pd.DataFrame(summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", type=Path, help="a probe's kernel.csv (or .csv.gz)")
    parser.add_argument("--kv-bytes", type=int, default=KV_BYTES, help="K and V bytes of a cached token, one layer")
    parser.add_argument("--shapes", default=HBM_SHAPES, help="shapes to list: seqs/chunk/cached,...")
    args = parser.parse_args(argv)
    if args.kv_bytes < 1:
        raise SystemExit(f"error: --kv-bytes must be >= 1, got {args.kv_bytes}")
    try:
        picked = [tuple(int(v) for v in shape.split("/")) for shape in args.shapes.split(",") if shape]
    except ValueError:
        raise SystemExit(f"error: --shapes takes seqs/chunk/cached,... (integers), got {args.shapes!r}") from None
    table, summary = compare(pd.read_csv(args.kernel), args.kv_bytes)
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    shown = table.set_index(["seqs", "chunk", "cached"], drop=False)
    shown = shown[shown.index.isin(picked)]
    print(shown[["launch", "seqs", "chunk", "cached", "gb", "us", *ERRORS]]
          .to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
