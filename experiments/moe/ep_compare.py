"""Simulated against measured decode steps of a mixture-of-experts model at TP=N, experts sliced
(tp) and whole experts per rank (ep): the decode.csv of experiments/moe/ep_decode.py priced by
the roofline (sim.roofline, the planner's default cost model) on a conf/hardware entry.

    python experiments/moe/ep_compare.py experiments/moe/h200x2_ep_run2/decode.csv --hardware h200 --fit

(a decode.csv without the prompt_len, output_len and all_reduce columns, as run 1's, takes them as
flags: --prompt-len 128 --output-len 64 --all-reduce tp=symmetric,ep=nccl)

Each (mode, batch) row is priced as ep_decode.py ran it: B sequences of prompt_len tokens, the
median of the roofline's prices of the full-batch decode steps (each sequence's context
prompt_len .. prompt_len + output_len - 2), greedy sampling, each mode at the all-reduce its
engine set up (decode.csv's all_reduce column, else --all-reduce). The roofline's step less its
host part (RooflineCostModel.host_time) is compared with the measured step, which is device time
(the engine overlaps the host's work). Columns, in ms but the ratios: measured and simulated steps
(with the hardware's expert parallelism figures, hardware.expert_parallel_layer_s and
expert_parallel_efficiency), the ep - tp gap measured, simulated and by the roofline alone (those
figures at 0 and 1), and ep/tp; "same AR" prices ep at tp's all-reduce, as a planner compares the
placements (both at one execution.all_reduce).

--fit: the two figures that price the measured ep - tp gaps best (least squares, a >= 0 and the
efficiency in (0, 1]): gap_measured - gap_roofline = layers x a + (1 / efficiency - 1) x R(B), R the
busiest rank's roofline expert time (sim.moe_ranks.RankExpertPhase.roofline_time).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.collectives import ALL_REDUCES
from harness.config import load_hardware
from sim.features import decode_attention_pairs
from sim.moe_ranks import RankExpertPhase
from sim.roofline import RooflineCostModel
from sim.specs import HardwareSpec, ModelSpec, preset_fields

MODES = ("tp", "ep")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path, help="ep_decode.py's decode.csv")
    p.add_argument("--hardware", default="h200", help="conf/hardware entry")
    p.add_argument("--prompt-len", type=int, help="where decode.csv has no prompt_len column")
    p.add_argument("--output-len", type=int, help="where decode.csv has no output_len column")
    p.add_argument("--all-reduce", default="", help="where decode.csv has no all_reduce column: "
                   f"mode=value pairs, e.g. tp=symmetric,ep=nccl (values {ALL_REDUCES})")
    p.add_argument("--skew", type=float, default=0.0, help="routing skew (0: uniform, the planner's default)")
    p.add_argument("--fit", action="store_true", help="fit expert_parallel_layer_s and _efficiency")
    p.add_argument("--out", type=Path, help="also write the table (markdown) here")
    return p.parse_args(argv)


def measured(args: argparse.Namespace) -> pd.DataFrame:
    """decode.csv with prompt_len, output_len and all_reduce for every row (one line if missing)."""
    df = pd.read_csv(args.csv)
    for column, value in (("prompt_len", args.prompt_len), ("output_len", args.output_len)):
        if column not in df:
            if value is None:
                raise SystemExit(f"{args.csv} has no {column} column: give --{column.replace('_', '-')}")
            df[column] = value
    if "all_reduce" not in df:
        pairs = dict(item.split("=", 1) for item in args.all_reduce.split(",") if "=" in item)
        bad = {m: v for m, v in pairs.items() if m not in MODES or v not in ALL_REDUCES}
        missing = sorted(set(df["mode"]) - set(pairs))
        if bad or missing:
            raise SystemExit(f"--all-reduce must name each mode of {sorted(set(df['mode']))} as mode=value with "
                             f"value in {ALL_REDUCES}; got {args.all_reduce!r}")
        df["all_reduce"] = df["mode"].map(pairs)
    return df


def decode_ms(model: ModelSpec, hw: HardwareSpec, tp: int, mode: str, all_reduce: str, skew: float,
              batch: int, prompt_len: int, output_len: int) -> float:
    """The roofline's median full-batch decode step less its host part, in ms."""
    cm = RooflineCostModel(model, hw, tp, all_reduce, skew, mode == "ep")
    prices = []
    for j in range(output_len - 1):
        context = batch * (prompt_len + j)
        prices.append(cm.time_for(batch, batch, context, decode_attention_pairs(context, batch), batch)
                      - cm.host_time(batch))
    return 1e3 * statistics.median(prices)


def neutral(hw: HardwareSpec) -> HardwareSpec:
    """hw without the expert parallelism figures: the roofline alone."""
    return dataclasses.replace(hw, expert_parallel_layer_s=0.0, expert_parallel_efficiency=1.0)


def table(df: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, skew: float) -> pd.DataFrame:
    rows = []
    for (tp, batch), group in df.groupby(["tp", "batch"]):
        by_mode = {r.mode: r for r in group.itertuples()}
        if set(by_mode) != set(MODES):
            continue
        row: dict = {"batch": batch}
        roofline = {}
        for mode, r in by_mode.items():
            shape = (int(tp), mode, r.all_reduce, skew, int(batch), int(r.prompt_len), int(r.output_len))
            row[f"{mode} measured"] = r.median_step_ms
            row[f"{mode} sim"] = decode_ms(model, hw, *shape)
            roofline[mode] = decode_ms(model, neutral(hw), *shape)
        tp_row = by_mode["tp"]
        same = (int(tp), "ep", tp_row.all_reduce, skew, int(batch), int(tp_row.prompt_len), int(tp_row.output_len))
        row["ep-tp measured"] = row["ep measured"] - row["tp measured"]
        row["ep-tp sim"] = row["ep sim"] - row["tp sim"]
        row["ep-tp roofline"] = roofline["ep"] - roofline["tp"]
        row["ep/tp measured"] = row["ep measured"] / row["tp measured"]
        row["ep/tp sim"] = row["ep sim"] / row["tp sim"]
        row["ep/tp sim, same AR"] = decode_ms(model, hw, *same) / row["tp sim"]
        row["ep/tp roofline, same AR"] = decode_ms(model, neutral(hw), *same) / roofline["tp"]
        rows.append(row)
    if not rows:
        raise SystemExit("no batch has both a tp and an ep row")
    return pd.DataFrame(rows)


def fit(df: pd.DataFrame, model: ModelSpec, hw: HardwareSpec, skew: float) -> tuple[float, float, np.ndarray]:
    """(expert_parallel_layer_s, expert_parallel_efficiency, residuals in ms) by least squares of the
    gaps the roofline leaves (module docstring), a >= 0 and 1 / efficiency - 1 >= 0."""
    base = neutral(hw)
    x, y = [], []
    for tp, group in df.groupby("tp"):
        phase = RankExpertPhase(model, int(tp), skew, base.peak_flops * base.matmul_efficiency,
                                base.mem_bandwidth * base.bandwidth_efficiency)
        for batch, pair in group.groupby("batch"):
            by_mode = {r.mode: r for r in pair.itertuples()}
            if set(by_mode) != set(MODES):
                continue
            priced = {m: decode_ms(model, base, int(tp), m, r.all_reduce, skew, int(batch), int(r.prompt_len),
                                   int(r.output_len)) for m, r in by_mode.items()}
            y.append((by_mode["ep"].median_step_ms - by_mode["tp"].median_step_ms) - (priced["ep"] - priced["tp"]))
            x.append([model.num_moe_layers * 1e3, 1e3 * phase.roofline_time(int(batch))])
    a, b = nonnegative_lstsq(np.array(x), np.array(y))
    residuals = np.array(y) - np.array(x) @ np.array([a, b])
    return a, 1.0 / (1.0 + b), residuals


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """argmin |x c - y| over c >= 0, two columns: the unconstrained solution or the best on a face."""
    candidates = [np.linalg.lstsq(x, y, rcond=None)[0]]
    for keep in (0, 1):
        c = np.zeros(2)
        c[keep] = max(0.0, float(x[:, keep] @ y) / float(x[:, keep] @ x[:, keep]))
        candidates.append(c)
    feasible = [c for c in candidates if (c >= 0).all()]
    best = min(feasible, key=lambda c: float(np.sum((x @ c - y) ** 2)))
    return float(best[0]), float(best[1])


def markdown(t: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(t.columns) + " |", "|---" * len(t.columns) + "|"]
    for _, row in t.iterrows():
        lines.append("| " + " | ".join(f"{int(v)}" if c == "batch" else f"{v:.3f}" if "/" in c else f"{v:.2f}"
                                      for c, v in row.items()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    df = measured(args)
    hw = load_hardware(args.hardware, "--hardware")
    presets = df["preset"].unique()
    if len(presets) != 1:
        raise SystemExit(f"{args.csv}: one preset expected, got {list(presets)}")
    model = ModelSpec(**preset_fields(str(presets[0])))
    t = table(df, model, hw, args.skew)
    text = (f"# {presets[0]} decode step (ms), measured ({args.csv.name}) against the roofline on "
            f"{hw.name} (skew {args.skew})\n\n{markdown(t)}\n")
    if args.fit:
        a, efficiency, residuals = fit(df, model, hw, args.skew)
        text += (f"\nfit: expert_parallel_layer_s = {a:.3g} s, expert_parallel_efficiency = {efficiency:.3g}; "
                 f"residual gaps (ms) {np.round(residuals, 3).tolist()}\n")
    print(text, end="")
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
