"""The driver's result tables, rewritten as each run finishes (a call cut short keeps what it has):

  runs.csv       every run's summary row (measured and simulated), with its fleet, workload, load
  compare.csv    one row per cell, metric and simulated side: measured, simulated, relative error,
                 the issue's target and whether it is met
  compare.md     the errors as a table, one row per cell and simulated side (* = outside target)
  transfers.csv  each request the measured disaggregated fleet moved: its bytes and transfer time
and the link fit (fit_link) the calibrated simulations use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare.tables import markdown

# metric -> the target (relative error)
TARGETS = {"ttft_p50_s": 0.10, "ttft_p90_s": 0.10, "tpot_p50_s": 0.10, "tpot_p90_s": 0.10,
           "output_tok_s": 0.05, "request_s": 0.05, "transfer_p50_s": 0.15}
KEYS = ("fleet", "workload", "load")


def runs_path(call_dir: Path) -> Path:
    """A call's runs table: runs.csv, or runs.csv.gz where it was committed gzipped."""
    plain = call_dir / "runs.csv"
    return plain if plain.is_file() else call_dir / "runs.csv.gz"


class Book:
    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.runs: list[dict] = []
        self.rows: list[dict] = []
        self.transfers: list[pd.DataFrame] = []
        self.notes: list[str] = []

    def run(self, side: str, cell: dict, summary: dict) -> None:
        self.runs.append({"side": side, **cell, **summary})
        pd.DataFrame(self.runs).to_csv(self.out / "runs.csv", index=False)

    def compare(self, cell: dict, measured: dict, simulated: dict, sim_side: str) -> list[dict]:
        """The cell's rows for each metric both sides have; written out at once."""
        rows = compare_rows(cell, measured, simulated, sim_side)
        self.rows.extend(rows)
        self._write()
        return rows

    def moved(self, cell: dict, requests: pd.DataFrame) -> None:
        """The measured disaggregated fleet's transfers of one run."""
        moved = requests[requests["decode_replica"] >= 0]
        frame = moved[["prompt_tokens", "transfer_bytes", "transfer_s", "transfer_wait_s"]].assign(**cell)
        self.transfers.append(frame)
        pd.concat(self.transfers, ignore_index=True).to_csv(self.out / "transfers.csv", index=False)

    def note(self, text: str) -> None:
        self.notes.append(text)
        self._write()

    def _write(self) -> None:
        if self.rows:
            table = pd.DataFrame(self.rows)
            table.to_csv(self.out / "compare.csv", index=False)
            text = error_table(table)
        else:
            text = "no cell finished\n"
        if self.notes:
            text += "\n" + "\n".join(f"- {n}" for n in self.notes) + "\n"
        (self.out / "compare.md").write_text(text)


def compare_rows(cell: dict, measured: dict, simulated: dict, sim_side: str) -> list[dict]:
    """compare.csv's rows of one cell and simulated side: each metric of TARGETS both sides have."""
    rows = []
    for metric, target in TARGETS.items():
        m, s = float(measured.get(metric, np.nan)), float(simulated.get(metric, np.nan))
        if not (np.isfinite(m) and np.isfinite(s)) or m == 0:
            continue
        error = (s - m) / m
        rows.append({**cell, "sim": sim_side, "metric": metric, "measured": m, "simulated": s,
                     "rel_error": error, "target": target, "within": bool(abs(error) <= target)})
    return rows


def error_table(table: pd.DataFrame) -> str:
    """Relative errors in %, one row per cell and simulated side; * marks an error outside its target."""
    keys = [*KEYS, "rate_req_s", "num_requests", "sim"]
    rows: dict[tuple, dict] = {}
    for r in table.itertuples(index=False):
        values = [getattr(r, k) for k in keys]
        key = tuple(None if isinstance(v, float) and np.isnan(v) else v for v in values)  # NaN != NaN
        row = rows.setdefault(key, dict(zip(keys, values)))
        row[r.metric] = f"{100 * r.rel_error:+.1f}{'' if r.within else '*'}"
    wide = pd.DataFrame(list(rows.values()))
    wide = wide[[*keys, *(m for m in TARGETS if m in wide.columns)]].astype(object).fillna("")
    met = f"{int(table['within'].sum())} of {len(table)} comparisons within target"
    header = ("Simulated against measured, relative error in % (* outside the target: TTFT/TPOT 10%, "
              f"throughput 5%, median KV transfer 15%). {met}.\n\n")
    return header + markdown(wide) + "\n"


def fit_link(transfers: pd.DataFrame, priced_bandwidth: float, max_pairs: int = 200_000) -> dict:
    """transfer_s = latency + bytes / bandwidth fitted to measured transfers, robustly (a measured
    transfer can include a step's wait): the Theil-Sen slope (the median of pairwise slopes, over
    at most max_pairs pairs drawn with a fixed seed), and the latency that makes the fit's median
    transfer the measured median (the target is the median). A slope <= 0 keeps the priced
    bandwidth; a negative latency becomes 0 with the bandwidth of the median transfer."""
    x = transfers["transfer_bytes"].to_numpy(dtype=float)
    y = transfers["transfer_s"].to_numpy(dtype=float)
    slope = _theil_sen(x, y, max_pairs)
    fitted = np.isfinite(slope) and slope > 0
    bandwidth = 1.0 / slope if fitted else priced_bandwidth
    latency = float(np.median(y) - np.median(x) / bandwidth)
    if latency < 0:
        latency, bandwidth, fitted = 0.0, float(np.median(x) / np.median(y)), False
    predicted = latency + x / bandwidth
    return {"transfers": len(x), "bandwidth": bandwidth, "slope_fitted": bool(fitted), "latency_s": latency,
            "measured_p50_s": float(np.median(y)), "fit_p50_s": float(np.median(predicted)),
            "measured_p90_s": float(np.quantile(y, 0.9)), "fit_p90_s": float(np.quantile(predicted, 0.9)),
            "mean_mb": float(x.mean() / 1e6)}


def _theil_sen(x: np.ndarray, y: np.ndarray, max_pairs: int) -> float:
    n = len(x)
    if n * (n - 1) // 2 <= max_pairs:
        i, j = np.triu_indices(n, 1)
    else:
        rng = np.random.default_rng(0)
        i, j = rng.integers(0, n, max_pairs), rng.integers(0, n, max_pairs)
    dx = x[j] - x[i]
    keep = dx != 0
    return float(np.median((y[j] - y[i])[keep] / dx[keep])) if keep.any() else float("nan")
