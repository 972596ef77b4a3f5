"""Reading request traces: path resolution and validation with file/row/column errors.

Two formats, told apart by the file's suffix:
- CSV (any suffix but .jsonl): a header row, then one request a row. Rows are numbered as a
  spreadsheet shows them: the header is line 1, the first request line 2.
- Mooncake JSONL (.jsonl): one JSON object a line, `timestamp` (ms), `input_length`,
  `output_length` and `hash_ids` (ids of the prompt's 512-token blocks, harness.workloads.mooncake).
  It is read into the CSV columns (times in seconds) plus a `hash_ids` column of lists.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE_DIR = REPO_ROOT.parent / "shared" / "traces"

ARRIVAL_COLUMN = "arrived_at"
PROMPT_COLUMN = "num_prefill_tokens"
OUTPUT_COLUMN = "num_decode_tokens"
HASH_COLUMN = "hash_ids"  # Mooncake traces only: the prompt's block ids
MOONCAKE_SUFFIX = ".jsonl"
GZIP_SUFFIX = ".gz"  # either format may come gzipped (x.jsonl.gz, x.csv.gz)
# Published traces' own names, read (case aside) where this project's column is missing: Azure's raw
# LLM inference traces (2023 code and conversation, 2024 week-long; TIMESTAMP a date and time) and
# BurstGPT (Timestamp in seconds, Request tokens, Response tokens)
RAW_COLUMNS = {ARRIVAL_COLUMN: ("TIMESTAMP",), PROMPT_COLUMN: ("ContextTokens", "Request tokens"),
               OUTPUT_COLUMN: ("GeneratedTokens", "Response tokens")}
# the Mooncake field each column is read from; timestamps are in milliseconds
MOONCAKE_FIELDS = {ARRIVAL_COLUMN: "timestamp", PROMPT_COLUMN: "input_length", OUTPUT_COLUMN: "output_length",
                   HASH_COLUMN: "hash_ids"}
# hash ids are names: any 64-bit integer, signed or unsigned (a signed id is read as its two's complement)
MIN_HASH_ID, HASH_ID_SPAN = -(2**63), 2**64
# the least output a trace may record: real traces hold some 0s (build.py serves them as 1 token, the
# one every request samples, and logs how many); prompts must have a token
MIN_TRACE_OUTPUT = 0
# the most tokens a trace may record for a prompt or an output: far past any model's context (such a
# request is clipped or skipped anyway), and small enough that a float cell converts to int64 exactly
# and sums over rows cannot overflow; a larger count is a corrupt cell, not a request
MAX_TRACE_TOKENS = 2**31 - 1
# what a trace of lengths only (no arrival times) is replayed with: its lengths at Poisson arrivals
LENGTHS_ONLY_RECIPE = "workload=trace_lengths workload.trace_path=FILE workload.rate=REQ_PER_S"


log = logging.getLogger(__name__)


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
    for candidate in candidates:
        if candidate.is_dir():
            raise TraceError(f"workload.trace_path: {str(candidate)!r} is a directory, not a trace file "
                             "(name a .csv or .jsonl file in it)")
    tried = ", ".join(str(c) for c in candidates)
    raise TraceError(f"workload.trace_path: trace file {trace_path!r} not found (tried {tried})")


def read_trace(path: Path, columns: list[str], start_row: int = 0, num_rows: int | None = None) -> pd.DataFrame:
    """The requested columns of rows [start_row, start_row + num_rows), validated.

    Length columns must hold whole numbers (prompts >= 1, outputs >= MIN_TRACE_OUTPUT); the arrival
    column finite numbers >= 0 (seconds), or, under a raw trace's name, dates and times (read as seconds).
    """
    if is_mooncake(path):
        return read_mooncake(path, columns, start_row, num_rows)
    try:
        with _text(path) as head:
            if head.read(4096).lstrip().startswith("{"):
                raise TraceError(f"{path}: holds JSON lines, read as Mooncake JSONL only from a file whose name ends "
                                 f"in {MOONCAKE_SUFFIX}: name it .jsonl")
        # bytes that are not UTF-8 are replaced: in a column read they make a bad cell, named below
        frame = pd.read_csv(path, skipinitialspace=True, encoding="utf-8-sig", encoding_errors="replace")
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: the trace file is empty (expected a header with {columns})") from None
    except pd.errors.ParserError as error:
        raise TraceError(f"{path}: not a valid CSV file: {str(error).strip()}".replace("\n", " ")) from None
    except (OSError, EOFError) as error:
        raise TraceError(f"{path}: cannot read: {error}") from None
    frame.columns = [str(c).strip() for c in frame.columns]
    source = {column: _source_column(path, frame, column) for column in columns}
    for name in source.values():
        if f"{name}.1" in frame.columns:  # pandas renames a repeated header name X to X.1
            raise TraceError(f"{path}: column {name!r} appears more than once in the header: keep one")
    if frame.empty:
        raise TraceError(f"{path}: the trace has a header but no request rows")
    if start_row >= len(frame):
        raise TraceError(f"{path}: workload.start_row={start_row} but the trace has only {len(frame)} rows")
    stop = len(frame) if num_rows is None else min(len(frame), start_row + num_rows)
    frame = frame.iloc[start_row:stop]
    out = {}
    for column, name in source.items():
        # a raw trace's times are dates and times (Azure) unless its first is a number (BurstGPT's
        # seconds): judged by one cell, so that a bad cell is named as itself, not as the first
        dated = name != ARRIVAL_COLUMN and pd.to_numeric(frame[name].iloc[:1], errors="coerce").isna().all()
        if column == ARRIVAL_COLUMN and dated:
            out[column] = _seconds(path, frame[name], name)
            continue
        values = _numeric(path, frame[name], name)
        if column == ARRIVAL_COLUMN:
            bad = ~np.isfinite(values) | (values < 0)
            _raise_first(path, frame, name, bad, "must be a finite time >= 0 seconds")
            out[column] = values.astype(np.float64)
        else:
            bad = ~np.isfinite(values) | (values != np.floor(values))
            _raise_first(path, frame, name, bad, "must be a whole number of tokens")
            least = MIN_TRACE_OUTPUT if column == OUTPUT_COLUMN else 1
            _raise_first(path, frame, name, values < least, f"must be a token count >= {least}")
            _raise_first(path, frame, name, values > MAX_TRACE_TOKENS, f"must be a token count <= {MAX_TRACE_TOKENS}")
            out[column] = values.astype(np.int64)
    return pd.DataFrame(out, index=frame.index)


def _source_column(path: Path, frame: pd.DataFrame, column: str) -> str:
    """The file's column that `column` is read from: itself, else a raw trace's name for it."""
    if column in frame.columns:
        return column
    names = {str(c).lower(): str(c) for c in frame.columns}
    for raw in RAW_COLUMNS[column]:
        if raw.lower() in names:
            return names[raw.lower()]
    hint = ""
    if column == ARRIVAL_COLUMN:
        hint = f"; for a trace of lengths only, draw Poisson arrival times: {LENGTHS_ONLY_RECIPE}"
    raise TraceError(f"{path}, line 1 (header): missing column {column!r} (or a raw trace's: "
                     f"{' or '.join(map(repr, RAW_COLUMNS[column]))}); found {list(frame.columns)}{hint}")


def _seconds(path: Path, series: pd.Series, column: str) -> np.ndarray:
    """A raw trace's date and time strings (ISO, with or without a UTC offset: Azure's TIMESTAMP) as
    seconds from the earliest row read."""
    times = pd.to_datetime(series.astype(str), format="ISO8601", utc=True, errors="coerce")
    bad = times.isna().to_numpy()
    if bad.any():
        where = int(np.argmax(bad))
        raise TraceError(f"{path}, line {_line(path, series.index[where])}, column {column!r}: expected a date and "
                         f"time (such as 2023-11-16 18:15:46.68), got {series.iloc[where]!r}")
    return (times - times.min()).dt.total_seconds().to_numpy(dtype=np.float64)


def _numeric(path: Path, series: pd.Series, column: str) -> np.ndarray:
    # a column of True / False cells reads as booleans, which to_numeric would take as 1 and 0
    converted = pd.to_numeric(series, errors="coerce") if series.dtype != bool else pd.Series(np.nan, series.index)
    bad = converted.isna().to_numpy()
    if bad.any():
        where = int(np.argmax(bad))
        raw = series.iloc[where]
        raw = raw.item() if isinstance(raw, np.generic) else raw  # True, not np.True_
        shown = "an empty cell" if (isinstance(raw, float) and math.isnan(raw)) else f"{raw!r}"
        raise TraceError(
            f"{path}, line {_line(path, series.index[where])}, column {column!r}: expected a number, got {shown}"
        )
    return converted.to_numpy(dtype=np.float64)


def _raise_first(path: Path, frame: pd.DataFrame, column: str, bad: np.ndarray, rule: str) -> None:
    if bad.any():
        where = int(np.argmax(bad))
        value = frame[column].iloc[where]
        raise TraceError(f"{path}, line {_line(path, frame.index[where])}, column {column!r}: {rule}, got {value}")


def _line(path: Path, index: int) -> int:
    """The file line of request row `index` (0: the first after the header). pandas skips blank
    lines without numbering them, so they are counted here (only when an error names a line)."""
    row = -2  # the header makes it -1
    with _text(path) as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip(" \t\r\n"):  # what pandas reads as blank (skipinitialspace)
                row += 1
                if row == index:
                    return number
    return int(index) + 2


def is_mooncake(path: Path | str) -> bool:
    """Whether a trace file is read as Mooncake JSONL (by its suffix, gzipped or not) rather than as CSV."""
    return Path(path).name.lower().removesuffix(GZIP_SUFFIX).endswith(MOONCAKE_SUFFIX)


def _text(path: Path):
    """The file as text (gunzipped by its suffix); a byte-order mark is skipped and bytes that are not
    UTF-8 are replaced, so that they fail, if at all, as a bad field or line named by its number.
    UTF-16 (what Windows PowerShell's `>` writes) would read as such garbage, so it is refused by name."""
    gzipped = path.name.lower().endswith(GZIP_SUFFIX)
    with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as raw:
        if raw.read(2) in (b"\xff\xfe", b"\xfe\xff"):
            raise TraceError(f"{path}: UTF-16 text (it starts with a UTF-16 byte-order mark): save it as UTF-8")
    if gzipped:
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace")
    return open(path, encoding="utf-8-sig", errors="replace")


def read_mooncake(path: Path, columns: list[str], start_row: int = 0, num_rows: int | None = None) -> pd.DataFrame:
    """read_trace for Mooncake JSONL: lines are numbered from 1, and errors name the JSON field.
    A byte-order mark, CRLF endings, blank lines and unknown fields are read past; a row without
    hash_ids shares no block (counted in the log)."""
    rows: dict[str, list] = {column: [] for column in columns}
    index: list[int] = []
    total = no_ids = 0
    try:
        with _text(path) as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                total += 1
                row = total - 1
                if row < start_row or (num_rows is not None and row >= start_row + num_rows):
                    continue  # outside the window: neither parsed nor checked, as CSV rows are not
                record = _json_object(path, number, line)
                no_ids += HASH_COLUMN in columns and MOONCAKE_FIELDS[HASH_COLUMN] not in record
                for column in columns:
                    rows[column].append(_mooncake_value(path, number, record, column))
                index.append(row)
    except (OSError, EOFError) as error:  # a .gz that is not gzip, or cut short
        raise TraceError(f"{path}: cannot read: {error}") from None
    if total == 0:
        raise TraceError(f"{path}: the trace file is empty (expected one JSON object a line with "
                         f"{[MOONCAKE_FIELDS[c] for c in columns]})")
    if start_row >= total:
        raise TraceError(f"{path}: workload.start_row={start_row} but the trace has only {total} rows")
    if no_ids:
        log.warning("%s: %d rows have no hash_ids; their prompts share no blocks with other requests", path, no_ids)
    out = {c: np.asarray(v, dtype=np.float64 if c == ARRIVAL_COLUMN else np.int64) for c, v in rows.items()
           if c != HASH_COLUMN}
    if HASH_COLUMN in rows:
        out[HASH_COLUMN] = pd.Series(rows[HASH_COLUMN], index=index, dtype=object)
    return pd.DataFrame(out, index=index, columns=columns)


def _json_object(path: Path, number: int, line: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{path}, line {number}: not valid JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(record, dict):
        raise TraceError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}")
    return record


def _mooncake_value(path: Path, number: int, record: dict, column: str):
    """One checked field of a Mooncake record, in the column's unit (seconds for times; hash ids
    as unsigned 64-bit integers)."""
    name = MOONCAKE_FIELDS[column]
    where = f"{path}, line {number}, field {name!r}"
    if column == HASH_COLUMN and name not in record:
        return []
    if name not in record:
        hint = "; for arrivals at a rate: workload.arrival=poisson workload.rate=REQ_PER_S" \
            if column == ARRIVAL_COLUMN else ""
        raise TraceError(f"{where}: missing; found {sorted(record)}{hint}")
    value = record[name]
    if column == HASH_COLUMN:
        if not isinstance(value, list) or \
                not all(_is_int(v) and MIN_HASH_ID <= v < HASH_ID_SPAN for v in value):
            raise TraceError(f"{where}: must be a list of 64-bit integers (signed or unsigned), got {_shown(value)}")
        return [v % HASH_ID_SPAN for v in value]
    if column == ARRIVAL_COLUMN:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise TraceError(f"{where}: must be a finite time >= 0 milliseconds, got {_shown(value)}")
        return value / 1000.0
    least = MIN_TRACE_OUTPUT if column == OUTPUT_COLUMN else 1
    if not (_is_int(value) or (isinstance(value, float) and value.is_integer())) or value < least:
        raise TraceError(f"{where}: must be a whole number of tokens >= {least}, got {_shown(value)}")
    if value > MAX_TRACE_TOKENS:
        raise TraceError(f"{where}: must be a token count <= {MAX_TRACE_TOKENS}, got {_shown(value)}")
    return int(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
