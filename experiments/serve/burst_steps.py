"""How the engine server and the simulator split a served case's bursts into prefill steps.

    python -m experiments.serve.burst_steps OUT --case mooncake_50 [--trace-dir DIR] [--bursts 3] [--set K=V ...]

OUT: bench_serve's --out folder (as experiments/serve/ttft_split.py reads it). The case's requests
are simulated at the engine server's arrivals (its requests' `arrival`: when its core received each)
with the simulator server's settings and the engine server's measured host, as ttft_split's
`simulator at engine_server's arrivals` row. A burst: requests whose arrivals follow each other
within --gap-ms. Per burst, the prefill steps that started from its first arrival to its last first
token, each as its prefill tokens; `same_split`: both ran the same prefill steps (equal token counts,
in order). Prints a summary (prefill steps, sequences per prefill step, the core's TTFT, the bursts
split the same way) and the first --bursts bursts of two requests or more, step by step (times in
ms from the burst's first arrival; the engine's launch_s: the host time of its submit()).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.split_inputs import served_overrides, server_hosts, unpack
from experiments.serve.step_prices import case_overrides
from experiments.serve.tables import case_requests
from experiments.serve.ttft_split import client_records, simulation_at
from harness.compare.tables import markdown

STEP_COLUMNS = ["start", "duration", "requests", "prefill_tokens"]


def bursts(arrivals: np.ndarray, gap_s: float) -> np.ndarray:
    """Each arrival's burst number (arrivals sorted): a new burst after a gap over gap_s."""
    return np.concatenate([[0], np.cumsum(np.diff(arrivals) > gap_s)]).astype(int)


def burst_steps(requests: pd.DataFrame, steps: pd.DataFrame, gap_s: float) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """Per burst (requests with arrival and first_token, on steps' clock): its requests and the
    prefill steps that started from its first arrival to its last first token."""
    requests = requests.sort_values("arrival", kind="stable")
    prefills = steps[steps["prefill_tokens"] > 0]
    out = []
    for _, group in requests.groupby(bursts(requests["arrival"].to_numpy(float), gap_s)):
        t0, t1 = group["arrival"].min(), group["first_token"].max()
        out.append((group, prefills[(prefills["start"] >= t0) & (prefills["start"] < t1)]))
    return out


def summary(label: str, requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
    prefills = steps[steps["prefill_tokens"] > 0]
    row = {"source": label, "prefill_steps": len(prefills),
           "seqs_per_prefill_p50": float(prefills["requests"].median()),
           "ttft_p50": float(np.percentile(requests["ttft"], 50) * 1e3),
           "ttft_p90": float(np.percentile(requests["ttft"], 90) * 1e3)}
    if "cuda_graph" in prefills:
        row["eager_prefill_steps"] = int((prefills["cuda_graph"] == 0).sum())
    return row


def case_inputs(out: Path, tmp: Path, case: str,
                trace_dir: str | None) -> tuple[list[str], pd.DataFrame, pd.DataFrame, float]:
    """(simulation overrides, the engine server's requests of the case, its steps in the case's
    time, its measured host speed)."""
    folders = unpack(out, tmp, optional=("sim_server",))
    plan = json.loads((folders["harness"] / "plan.json").read_text())
    tags = [Path(entry["out"]).name for entry in plan]
    if case not in tags:
        raise SystemExit(f"error: --case {case!r} is not among the cases {tags}")
    given = case_overrides(folders["harness"], case)
    if trace_dir:
        given = [o for o in given if not o.startswith("workload.trace_dir=")]
        given.append(f"workload.trace_dir={Path(trace_dir).resolve()}")
    overrides = served_overrides(folders, given)
    engine = folders["engine_server"]
    records = [client_records(engine, tag) for tag in tags]
    own = case_requests(pd.read_csv(engine / "requests.csv"), [len(r) for r in records], records)[tags.index(case)]
    steps = host.server_steps(engine.parent, "engine_server")
    if steps is None:
        raise SystemExit(f"error: {out} has no engine server steps.csv.gz")
    start = own["arrival"].min()
    steps = steps[(steps["start"] >= start - 1e-3) & (steps["start"] <= own["finish"].max())]
    steps = steps.assign(start=steps["start"] - start)
    own = own.assign(arrival=own["arrival"] - start, first_token=own["first_token"] - start)
    return overrides, own, steps, server_hosts(folders, overrides).get("engine_server", 1.0)


def ms_table(steps: pd.DataFrame, t0: float, columns: list[str]) -> pd.DataFrame:
    table = steps[columns].copy()
    table["start"] = (table["start"] - t0) * 1e3
    for column in ("duration", "launch_s"):
        if column in table:
            table[column] = table[column] * 1e3
    return table.round(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="bench_serve's --out folder")
    parser.add_argument("--case", required=True, help="the case (e.g. mooncake_50)")
    parser.add_argument("--trace-dir", default=None, help="folder of the trace files (default: the case's)")
    parser.add_argument("--bursts", type=int, default=3, help="bursts to print step by step")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="a new burst after an arrival gap over this")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings to simulate with")
    args = parser.parse_args(argv)
    if args.bursts < 0 or not args.gap_ms > 0:
        parser.error("--bursts must be >= 0 and --gap-ms > 0")
    warnings.simplefilter("ignore")  # the cost model's extrapolation warnings
    with tempfile.TemporaryDirectory() as tmp:
        overrides, own, engine_steps, scale = case_inputs(args.out, Path(tmp), args.case, args.trace_dir)
    sim, sim_steps = simulation_at([*overrides, *args.set], own, scale)
    gap = args.gap_ms / 1e3
    engine_bursts = burst_steps(own, engine_steps, gap)
    sim_bursts = burst_steps(sim.assign(first_token=sim["arrival"] + sim["ttft"]), sim_steps, gap)
    same = [tuple(e[1]["prefill_tokens"]) == tuple(s[1]["prefill_tokens"])
            for e, s in zip(engine_bursts, sim_bursts, strict=True) if len(e[0]) > 1]
    rows = [summary("engine_server", own, engine_steps), summary("simulator at its arrivals", sim, sim_steps)]
    table = pd.DataFrame(rows).assign(bursts=len(same), same_split=sum(same))
    print(f"host simulated at {scale:.3f}\n\n{markdown(table.round(2))}\n")
    shown = 0
    for (group, engine), (_, simulated) in zip(engine_bursts, sim_bursts, strict=True):
        if len(group) < 2 or shown >= args.bursts:
            continue
        shown += 1
        t0 = group["arrival"].min()
        print(f"### burst at {t0:.3f} s: {len(group)} requests, arrivals (ms) "
              f"{((group['arrival'] - t0) * 1e3).round(1).tolist()}\n")
        launch = ["launch_s"] if "launch_s" in engine else []
        print("engine server:\n\n" + markdown(ms_table(engine, t0, STEP_COLUMNS + launch)) + "\n")
        print("simulator:\n\n" + markdown(ms_table(simulated, t0, STEP_COLUMNS)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
