"""Reading request traces (CSV): path resolution and validation with file/row/column errors.

Rows are numbered as a spreadsheet shows them: the header is line 1, the first request line 2.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE_DIR = REPO_ROOT.parent / "shared" / "traces"

ARRIVAL_COLUMN = "arrived_at"
PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"
# what a trace of lengths only (no arrival times) is replayed with: its lengths at Poisson arrivals
LENGTHS_ONLY_RECIPE = "workload=trace_lengths workload.trace_path=FILE workload.rate=REQ_PER_S"


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file, line and column."""


def resolve_trace_path(trace_path: str, trace_dir: str | None = None) -> Path:
    """Absolute paths as given; relative ones are tried against the cwd, then the trace folder."""
    path = Path(trace_path).expanduser()
    if path.is_absolute():
        candidates = [path]
    else:
        folder = Path(trace_dir).expanduser() if trace_dir else DEFAULT_TRACE_DIR
        candidates = [Path.cwd() / path, folder / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise TraceError(f"workload.trace_path: trace file {trace_path!r} not found (tried {tried})")


def read_trace(path: Path, columns: list[str], start_row: int = 0, num_rows: int | None = None) -> pd.DataFrame:
    """The requested columns of rows [start_row, start_row + num_rows), validated.

    Length columns must hold integers >= 1; the arrival column finite numbers >= 0.
    """
    try:
        frame = pd.read_csv(path, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: the trace file is empty (expected a header with {columns})") from None
    except pd.errors.ParserError as error:
        raise TraceError(f"{path}: not a valid CSV file: {error}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    for column in columns:
        if column not in frame.columns:
            hint = ""
            if column == ARRIVAL_COLUMN:
                hint = f"; for a trace of lengths only, draw Poisson arrival times: {LENGTHS_ONLY_RECIPE}"
            raise TraceError(f"{path}, line 1 (header): missing column {column!r}; found {list(frame.columns)}{hint}")
    if frame.empty:
        raise TraceError(f"{path}: the trace has a header but no request rows")
    if start_row >= len(frame):
        raise TraceError(f"{path}: workload.start_row={start_row} but the trace has only {len(frame)} rows")
    stop = len(frame) if num_rows is None else min(len(frame), start_row + num_rows)
    frame = frame.iloc[start_row:stop]
    out = {}
    for column in columns:
        values = _numeric(path, frame[column], column)
        if column == ARRIVAL_COLUMN:
            bad = ~np.isfinite(values) | (values < 0)
            _raise_first(path, frame, column, bad, "must be a finite time >= 0 seconds")
            out[column] = values.astype(np.float64)
        else:
            bad = ~np.isfinite(values) | (values != np.floor(values))
            _raise_first(path, frame, column, bad, "must be a whole number of tokens")
            _raise_first(path, frame, column, values < 1, "must be a token count >= 1")
            out[column] = values.astype(np.int64)
    return pd.DataFrame(out, index=frame.index)


def _numeric(path: Path, series: pd.Series, column: str) -> np.ndarray:
    converted = pd.to_numeric(series, errors="coerce")
    bad = converted.isna().to_numpy()
    if bad.any():
        where = int(np.argmax(bad))
        raw = series.iloc[where]
        shown = "an empty cell" if (isinstance(raw, float) and math.isnan(raw)) else f"{raw!r}"
        raise TraceError(
            f"{path}, line {_line(series.index[where])}, column {column!r}: expected a number, got {shown}"
        )
    return converted.to_numpy(dtype=np.float64)


def _raise_first(path: Path, frame: pd.DataFrame, column: str, bad: np.ndarray, rule: str) -> None:
    if bad.any():
        where = int(np.argmax(bad))
        value = frame[column].iloc[where]
        raise TraceError(f"{path}, line {_line(frame.index[where])}, column {column!r}: {rule}, got {value}")


def _line(index: int) -> int:
    return int(index) + 2  # header is line 1
