"""The decode kernel's per-program rate (hardware.decode_program_bandwidth) from a decode_balance
probe's kernel.csv, and whether one rate holds across its 'tail' rows.

    python -m experiments.kernels.program_rate experiments/kernels/balance_h100/kernel.csv \
        experiments/kernels/balance_h200/kernel.csv [--per-sm 5]

The conf/hardware figure: the batch of 48 'tail' contexts, 'picked' variant (one split: a tenth of
the batch walks 3,700 keys in one program each), 3,700 keys x 512 B over the kernel's whole time.
Then, per 'tail' row of one split (batch >= 48), the rate the probe's time implies under the
simulator's fluid (sim.decode_programs.walk_seconds: the programs share the bandwidth the 'even'
rows give, none faster than the rate): with every program running from the start, with --per-sm
programs per SM in launch order, and the latter after the launch's fixed time (the intercept of the
'even' rows, fitted with the bandwidth). --waves GBPS: every one-split row instead (even, ragged,
tail), each probe time beside the fluid's at that program rate, with and without the waves
(against_fluid; --fit: another probe's 'even' rows for the fixed time and bandwidth).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from experiments.kernels.balance_shapes import LONG_CONTEXT, contexts
from sim.decode_programs import walk_seconds

KEY_BYTES, HEADS, SMS = 512, 8, 132
EVEN_FIT = (48, 64, 128, 256, 512)  # one split; 96 left out: its 768 programs end in a thin last wave


def implied_rate(keys: np.ndarray, slots: int | None, bandwidth: float, seconds: float) -> float:
    """bytes/s of one program at which the fluid takes `seconds` (nan where none does)."""
    def walk(rate: float) -> float:
        return walk_seconds(keys, slots, bandwidth / KEY_BYTES, rate / KEY_BYTES)
    low, high = 1e8, 1e13
    if walk(high) > seconds:
        return float("nan")
    for _ in range(80):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if walk(mid) > seconds else (low, mid)
    return high


def even_fit(table: pd.DataFrame) -> tuple[float, float]:
    """(fixed seconds, bytes/s) of the probe's 'picked' even rows of EVEN_FIT: time = fixed + KV bytes / bandwidth."""
    even = table[(table.variant == "picked") & (table.contexts == "even") & table.batch.isin(EVEN_FIT)]
    design = np.c_[np.ones(len(even)), even.total_context * HEADS * KEY_BYTES]
    fixed_s, per_byte = np.linalg.lstsq(design, even.us * 1e-6, rcond=None)[0]
    return float(fixed_s), float(1 / per_byte)


def report(path: str, per_sm: int) -> pd.DataFrame:
    table = pd.read_csv(path)
    picked = table[table.variant == "picked"].set_index(["batch", "contexts"])
    fixed_s, bandwidth = even_fit(table)
    rows = []
    for batch in sorted(b for b, kind in picked.index if kind == "tail" and picked.loc[(b, kind), "splits"] == 1):
        seconds = picked.loc[(batch, "tail"), "us"] * 1e-6
        keys = np.tile(np.array(contexts("tail", batch, np.random.default_rng(0)), dtype=float), HEADS)
        rows.append({"batch": batch, "us": round(seconds * 1e6, 1),
                     "naive_GBps": round(LONG_CONTEXT * KEY_BYTES / seconds / 1e9, 1),
                     "all_at_once_GBps": round(implied_rate(keys, None, bandwidth, seconds) / 1e9, 1),
                     f"per_sm_{per_sm}_GBps": round(implied_rate(keys, per_sm * SMS, bandwidth, seconds) / 1e9, 1),
                     f"per_sm_{per_sm}_after_fixed_GBps": round(
                         implied_rate(keys, per_sm * SMS, bandwidth, seconds - fixed_s) / 1e9, 1)})
    print(f"{path}: 'even' rows {EVEN_FIT}: fixed {fixed_s * 1e6:.1f} us + bytes / {bandwidth / 1e12:.2f} TB/s")
    return pd.DataFrame(rows)


def against_fluid(path: str, per_sm: int, rate: float, fit_path: str | None = None) -> pd.DataFrame:
    """Per row of one split ('picked'; even, ragged and tail contexts, drawn again as the probe drew
    them, in its batch order): the probe's time beside the fluid's, all programs from the start and
    per_sm per SM in launch order, at `rate` bytes/s a program, after the fixed time and bandwidth
    of the 'even' rows of EVEN_FIT in fit_path (default: path). The rows whose programs overflow the
    GPU's slots show what the waves cost there."""
    fixed_s, bandwidth = even_fit(pd.read_csv(fit_path or path))
    table = pd.read_csv(path)
    picked = table[table.variant == "picked"].set_index(["batch", "contexts"])
    rng, rows = np.random.default_rng(0), []
    for batch in table.batch.drop_duplicates():
        for kind in ("even", "ragged", "tail"):  # decode_balance.kernel_rows' order of draws
            lens = np.array(contexts(kind, int(batch), rng), dtype=float)
            row = picked.loc[(batch, kind)]
            if row.splits != 1 or row.total_context != lens.sum():
                continue
            keys = np.tile(lens, HEADS)  # one split: launch order is KV head, then sequence
            walk = lambda slots: walk_seconds(keys, slots, bandwidth / KEY_BYTES, rate / KEY_BYTES)  # noqa: E731
            start, waves = fixed_s + walk(None), fixed_s + walk(per_sm * SMS)
            rows.append({"batch": int(batch), "contexts": kind, "programs": keys.size, "us": round(row.us, 1),
                         "all_start_us": round(start * 1e6, 1), f"per_sm_{per_sm}_us": round(waves * 1e6, 1),
                         "waves_added_us": round((waves - start) * 1e6, 1),
                         "probe_over_all_start_us": round(row.us - start * 1e6, 1)})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel_csv", nargs="+")
    parser.add_argument("--per-sm", type=int, default=5, help="programs one SM holds (hardware.decode_programs_per_sm)")
    parser.add_argument("--waves", type=float, default=None, metavar="GBPS",
                        help="instead: each one-split row against the fluid at this program rate (GB/s)")
    parser.add_argument("--fit", default=None, help="--waves: the probe whose 'even' rows give the fixed "
                        "time and bandwidth (default: each kernel_csv itself)")
    args = parser.parse_args(argv)
    for path in args.kernel_csv:
        if args.waves is not None:
            print(against_fluid(path, args.per_sm, args.waves * 1e9, args.fit).to_string(index=False))
        else:
            print(report(path, args.per_sm).to_string(index=False))


if __name__ == "__main__":
    main()
