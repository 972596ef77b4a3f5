"""The KV transfer time of disaggregated measure calls, measured against simulated, and the
simulator's transfer priced with and without the engine's receive side (docs/disaggregation.md,
"The receive's side").

    python -m experiments.disagg.transfer_parts CALL_DIR [CALL_DIR ...] [--out DIR] [--bandwidth B]
        [--landing-lag-s S] [--send-lag-s S] [--lags]

CALL_DIR: a `run_disagg measure` folder of an engine with BlockMover: runs.csv(.gz), settings.json and
the measured transfers, each (transfers.csv) or per cell (transfers_by_cell.csv). Each disaggregated
cell is re-simulated on CPU (the call's requests, blocks, profile and overrides, as
experiments/disagg/h200_run1/resim.py) twice: "before", the engine's send path as the measure
driver prices it (handshake and the send's queue behind the prefill step), and "after", with
fleet.transfer.recv_behind_step, bandwidth B (bytes/s), landing_lag_s and send_lag_s. Writes
DIR/transfer_parts.csv: per call, cell and side, the transfer's P10 / P50 / P90 (ms), measured and
simulated, the median's error, and the TTFT / TPOT P50 / P90 errors (%).

--lags (a `--keep-steps` call): the two host figures measured from the kept steps, on one-prompt
prefill steps matched to their transfers by prompt length: the send's post after the decode
step end before it (send_lag), and the landing after the decode step end before it (landing_lag).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.cells import simulate
from experiments.disagg.common import (
    LANDING_LAG_S,
    LANDING_LAG_SIGMA,
    RECEIVE_BANDWIDTH,
    SEND_LAG_S,
    SEND_LAG_SIGMA,
    Pools,
    Setup,
)
from experiments.disagg.h200_run1.resim import TRACE, call_profile
from experiments.disagg.tables import runs_path
from experiments.disagg.workloads import MEASURE_SCHEDULER, at_rate, class_workload
from harness.output.metrics import SUMMARY_STEP_COLUMNS

HERE = Path(__file__).resolve().parent
Z90 = 1.2815515655446004  # the standard normal's P90
QUANTILES = (0.1, 0.5, 0.9)
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s")


def call_setup(call: Path, extra: tuple[str, ...] = ()) -> tuple[Setup, pd.DataFrame]:
    runs = pd.read_csv(runs_path(call), dtype={"load": str})
    args = json.loads((call / "settings.json").read_text())["args"]
    model = args.get("model", "qwen3-0.6b")
    own = (*args.get("overrides", []), *args.get("sim_overrides", []), *extra)
    disaggregated = runs.fleet.str.fullmatch(r"\d+P\d+D")
    (fleet,) = set(runs.fleet[disaggregated])
    setup = Setup(model, "h200", Pools.parse(fleet), profile=call_profile(call, model), overrides=own)
    return setup, runs[(runs.side == "measured") & disaggregated]


def quantiles(values: pd.Series, prefix: str) -> dict[str, float]:
    return {f"{prefix}_p{int(100 * q)}_ms": round(1e3 * float(values.quantile(q)), 2) for q in QUANTILES}


def measured_quantiles(call: Path, row: pd.Series) -> dict[str, float]:
    """The cell's measured transfer quantiles (ms): from each transfer, else the call's per-cell table,
    else its runs table (P50 and P90 only: the committed m8 and m06 calls)."""
    if not (call / "transfers.csv").is_file() and not (call / "transfers_by_cell.csv").is_file():
        return {"measured_p10_ms": math.nan, **{f"measured_p{q}_ms": round(1e3 * row[f"transfer_p{q}_s"], 2)
                                                for q in (50, 90)}}
    if (call / "transfers.csv").is_file():
        moved = pd.read_csv(call / "transfers.csv", dtype={"load": str})
        cell = moved[(moved.fleet == row.fleet) & (moved.workload == row.workload) & (moved.load == row.load)]
        return quantiles(cell.transfer_s, "measured")
    table = pd.read_csv(call / "transfers_by_cell.csv", dtype={"load": str})
    (cell,) = table[(table.workload == row.workload) & (table.load == row.load)].itertuples()
    return {f"measured_p{int(100 * q)}_ms": getattr(cell, f"transfer_p{int(100 * q)}_ms") for q in QUANTILES}


def resimulate(call: Path, links: dict[str, dict], cells: list[str] | None = None,
               extra: tuple[str, ...] = ()) -> list[dict]:
    setup, measured = call_setup(call, extra)
    if cells:
        measured = measured[(measured.workload + ":" + measured.load).isin(cells)]
    rc = setup.run_config("sim", MEASURE_SCHEDULER)
    rows = []
    for _, row in measured.iterrows():
        rate = None if math.isnan(row.rate_req_s) else float(row.rate_req_s)
        workload = at_rate(class_workload(row.workload, str(TRACE), False), rate, int(row.num_requests))
        for side, extra in links.items():
            link = dataclasses.replace(setup.link(extra.get("bandwidth")), **{k: v for k, v in extra.items()
                                                                             if k != "bandwidth"})
            sim = simulate(setup, rc, "disaggregated", workload, int(row.num_blocks) // int(row.replicas), link)
            requests = sim.requests[sim.requests.decode_replica >= 0]
            summary = sim.summary.to_row()
            out = {"call": label(call), "fleet": row.fleet, "workload": row.workload, "load": row.load, "side": side,
                   **measured_quantiles(call, row), **quantiles(requests.transfer_s, "sim")}
            out["p50_err_pct"] = round(100 * (out["sim_p50_ms"] / out["measured_p50_ms"] - 1), 1)
            out["p50_within"] = abs(out["p50_err_pct"]) <= 15
            for metric in METRICS:
                out[f"{metric}_err_pct"] = round(100 * (summary[metric] / row[metric] - 1), 1)
            # the median in decode steps (TPOT P50: a decode replica's step), measured and simulated
            out["measured_p50_steps"] = round(out["measured_p50_ms"] / (1e3 * row.tpot_p50_s), 2)
            out["sim_p50_steps"] = round(out["sim_p50_ms"] / (1e3 * summary["tpot_p50_s"]), 2)
            rows.append(out)
            print(*(out[k] for k in ("call", "workload", "load", "side")),
                  f"P10/50/90 ms measured {out['measured_p10_ms']} / "
                  f"{out['measured_p50_ms']} / {out['measured_p90_ms']}, simulated {out['sim_p10_ms']} / "
                  f"{out['sim_p50_ms']} / {out['sim_p90_ms']} ({out['p50_err_pct']:+.1f}%); P50 in decode steps "
                  f"{out['measured_p50_steps']} / {out['sim_p50_steps']}", flush=True)
    return rows


def label(call: Path) -> str:
    """A call's name: its folder under experiments/disagg, else the folder's own name."""
    try:
        return str(call.resolve().relative_to(HERE))
    except ValueError:
        return call.name


def matched(call: Path):
    """Per loaded or offline cell of a `--keep-steps` call: (workload, load, its measured decode step
    ends, a frame of the transfers whose send did not wait for a prefill step: post and landed times,
    bytes), from one-prompt prefill steps whose prompt length is unique in the cell."""
    moved = pd.read_csv(call / "transfers.csv", dtype={"load": str})
    for (workload, load), cell in moved[moved.fleet == "1P1D"].groupby(["workload", "load"]):
        steps = pd.read_csv(call / f"steps_1P1D_{workload}_{load}.csv.gz")
        steps = steps[steps.side == "measured"].assign(end=lambda s: s.start + s.duration)
        prefill = steps[steps.pool == "prefill"].sort_values("start")
        one = prefill[(prefill.requests == 1) & (prefill.decode_tokens == 0)]
        one = one.drop_duplicates("prefill_tokens", keep=False).set_index("prefill_tokens")
        cell = cell.drop_duplicates("prompt_tokens", keep=False)
        cell = cell[cell.prompt_tokens.isin(one.index)]
        post = cell.prompt_tokens.map(one.end).to_numpy() + cell.transfer_wait_s.to_numpy()
        free = ~np.array([((prefill.start < t) & (prefill.end > t)).any() for t in post], dtype=bool)
        frame = pd.DataFrame({"post": post[free], "landed": post[free] + cell.transfer_s.to_numpy()[free],
                              "bytes": cell.transfer_bytes.to_numpy()[free]})
        yield workload, load, np.sort(steps[steps.pool == "decode"].end.to_numpy()), frame


def lags(call: Path) -> pd.DataFrame:
    """send_lag and landing_lag per cell (module doc)."""
    rows = []
    for workload, load, ends, moved in matched(call):
        if len(moved) < 10:
            continue
        send = moved.post - ends[np.searchsorted(ends, moved.post) - 1]
        land = moved.landed - ends[np.searchsorted(ends, moved.landed) - 1]
        rows.append({"call": label(call), "workload": workload, "load": load, "transfers": len(moved),
                     **{f"send_lag_p{int(100 * q)}_ms": round(1e3 * np.quantile(send, q), 2) for q in QUANTILES},
                     **{f"landing_lag_p{int(100 * q)}_ms": round(1e3 * np.quantile(land, q), 2) for q in QUANTILES}})
    return pd.DataFrame(rows)


def spread(table: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per lag, the lognormal sigma below and above its median that each cell's P10 and P90 give
    (ln(P50 / P10) / z90, ln(P90 / P50) / z90), the median over the cells."""
    out = {}
    for lag in ("landing_lag", "send_lag"):
        p10, p50, p90 = (table[f"{lag}_p{q}_ms"] for q in (10, 50, 90))
        out[lag] = (round(float(np.median(np.log(p50 / p10) / Z90)), 2),
                    round(float(np.median(np.log(p90 / p50) / Z90)), 2))
    return out


TARGETS = {"p50_err_pct": 15, "ttft_p50_s_err_pct": 10, "ttft_p90_s_err_pct": 10, "tpot_p50_s_err_pct": 10,
           "tpot_p90_s_err_pct": 10, "request_s_err_pct": 5}  # the targets (%)


def counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per side, how many cells meet each target (the transfer median's, TTFT's, TPOT's, throughput's)
    and how many comparisons in all, over the table's cells."""
    within = pd.DataFrame({metric: table[metric].abs() <= bound for metric, bound in TARGETS.items()})
    out = within.groupby(table.side, sort=False).sum()
    out["all"] = out.sum(axis=1)
    return out.assign(cells=table.groupby("side", sort=False).size())


def first_boundary(post: np.ndarray, landed: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each transfer landed at the first decode step boundary after its post."""
    return np.searchsorted(ends, landed - 1e-7) - np.searchsorted(ends, post) <= 1


def size_classes(call: Path, bandwidths: list[float], after: dict) -> pd.DataFrame:
    """Per size class (MB), the share of the loaded cells' fast transfers (under 30 ms, the send
    not behind a prefill step) that land at the first decode boundary after the post: measured,
    and simulated with `after` at each bandwidth. The wire decides it: a receive ready at a step's
    end lands at that boundary only if the wire ends within the landing lag after it."""
    setup, runs = call_setup(call)
    rc = setup.run_config("sim", MEASURE_SCHEDULER)
    parts = []
    for workload, load, ends, moved in matched(call):
        if load == "offline":
            continue
        fast = moved[moved.landed - moved.post < 0.03]
        parts.append(pd.DataFrame({"side": "measured", "mb": fast.bytes / 1e6,
                                   "first": first_boundary(fast.post.to_numpy(), fast.landed.to_numpy(), ends)}))
        (row,) = runs[(runs.workload == workload) & (runs.load == load)].itertuples()
        workload_ = at_rate(class_workload(workload, str(TRACE), False), float(row.rate_req_s), int(row.num_requests))
        for bandwidth in bandwidths:
            link = dataclasses.replace(setup.link(bandwidth), **{k: v for k, v in after.items() if k != "bandwidth"})
            sim = simulate(setup, rc, "disaggregated", workload_, int(row.num_blocks) // int(row.replicas), link,
                           step_columns=(*SUMMARY_STEP_COLUMNS, "start", "duration"))
            r = sim.requests[(sim.requests.decode_replica >= 0) & (sim.requests.transfer_s < 0.03)]
            decode = sim.steps[sim.steps.pool == "decode"]
            sim_ends = np.sort((decode.start + decode.duration).to_numpy())
            start = r.transfer_start.to_numpy()
            parts.append(pd.DataFrame({"side": f"sim_{bandwidth / 1e9:g}GBps", "mb": r.transfer_bytes / 1e6,
                                       "first": first_boundary(start, start + r.transfer_s.to_numpy(), sim_ends)}))
    table = pd.concat(parts, ignore_index=True)
    table["size_mb"] = pd.cut(table.mb, [0, 100, 200, 400, 800, 1200]).astype(str)
    share = table.pivot_table(index="size_mb", columns="side", values="first", aggfunc="mean", sort=False).round(2)
    counts = table[table.side == "measured"].groupby("size_mb").size().rename("measured_n")
    return share.join(counts).reset_index().assign(call=label(call))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calls", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--bandwidth", type=float, default=RECEIVE_BANDWIDTH)
    parser.add_argument("--landing-lag-s", type=float, default=LANDING_LAG_S)
    parser.add_argument("--send-lag-s", type=float, default=SEND_LAG_S)
    parser.add_argument("--landing-lag-sigma", type=float, nargs="+", default=LANDING_LAG_SIGMA,
                        metavar="SIGMA", help="one sigma, or two: below and above the median (0: a fixed lag)")
    parser.add_argument("--send-lag-sigma", type=float, nargs="+", default=SEND_LAG_SIGMA, metavar="SIGMA")
    parser.add_argument("--count", type=Path, nargs="+", default=None, metavar="TABLE",
                        help="count the cells within each target in written tables, and stop")
    parser.add_argument("--spread", type=Path, default=None, metavar="LAGS_CSV",
                        help="print each lag's sigmas below and above the median from a --lags table, and stop")
    parser.add_argument("--cells", nargs="+", default=None, metavar="WORKLOAD:LOAD",
                        help="only these cells, e.g. conversation:0.8")
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                        help="a simulator override on both sides, e.g. hardware.decode_programs_per_sm=5")
    parser.add_argument("--name", default="transfer_parts", help="the table's file name (DIR/NAME.csv)")
    parser.add_argument("--lags", action="store_true", help="measure the two lags from the kept steps")
    parser.add_argument("--size-classes", type=float, nargs="+", default=None, metavar="B",
                        help="the first-boundary share per size class, measured and simulated at each B (bytes/s)")
    args = parser.parse_args(argv)
    if args.spread is not None:
        print(spread(pd.read_csv(args.spread)))
        return
    if args.count:
        for table in args.count:
            print(table, counts(pd.read_csv(table, dtype={"load": str})).to_string(), sep="\n")
        return
    if not args.calls:
        parser.error("give at least one CALL_DIR")
    for name in ("landing_lag_sigma", "send_lag_sigma"):
        if len(getattr(args, name)) > 2:
            parser.error(f"--{name.replace('_', '-')} takes one sigma or two")
    args.out.mkdir(parents=True, exist_ok=True)
    after = {"bandwidth": args.bandwidth, "recv_behind_step": True, "landing_lag_s": args.landing_lag_s,
             "send_lag_s": args.send_lag_s, "landing_lag_sigma": tuple(args.landing_lag_sigma),
             "send_lag_sigma": tuple(args.send_lag_sigma)}
    if args.size_classes:
        table = pd.concat([size_classes(call, args.size_classes, after) for call in args.calls], ignore_index=True)
        print(table.to_string(index=False))
        table.to_csv(args.out / "transfer_size_classes.csv", index=False)
        return
    if args.lags:
        table = pd.concat([lags(call) for call in args.calls], ignore_index=True)
        print(table.to_string(index=False))
        table.to_csv(args.out / "transfer_lags.csv", index=False)
        return
    rows = [row for call in args.calls for row in resimulate(call, {"before": {}, "after": after}, args.cells,
                                                               tuple(args.extra))]
    table = pd.DataFrame(rows)
    table.to_csv(args.out / f"{args.name}.csv", index=False)
    print(counts(table).to_string())


if __name__ == "__main__":
    main()
