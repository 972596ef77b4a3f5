"""The engine's HTTP server against the harness's own run of the same requests, and against the
simulator-backed server: client-side TTFT / inter-token P50 and P90, and the server's overhead.

    python -m experiments.serve.bench_serve --out experiments/results/serve --capacity 12   # on a GPU

For each workload (--workloads: azure = the Azure conversation trace, mooncake = Mooncake's
conversation trace, poisson = synthetic) and each load (--loads, fractions of --capacity in
requests/s), the same requests (harness.workloads.build, at the load's rate: workload.rate_scale
for traces, workload.rate otherwise) are
  1. run by `python -m harness backend=engine` (the harness's own figures, no HTTP);
  2. replayed by experiments/serve/client.py against `python -m harness.serve backend=engine`
     (client-side figures; the server's requests.csv gives its own);
  3. replayed against `python -m harness.serve backend=sim` at time_scale=1.
serve.csv holds one row per (workload, load, source); serve.md the table plus the overhead: the
client's mean TTFT minus the engine server's own (HTTP, streaming, detokenisation per request) and
the same for the inter-token latency (per token).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve.client import replay
from harness.scripting import compose_run_config
from harness.serve.process import ServerProcess
from harness.workloads.build import build_workload

WORKLOADS = {"azure": ["workload=trace_azure_conv"], "mooncake": ["workload=mooncake"],
             "poisson": ["workload=poisson"]}


def workload_overrides(name: str, num_requests: int, rate: float, common: list[str],
                       extra: list[str]) -> list[str]:
    base = [*WORKLOADS[name], f"workload.num_requests={num_requests}", *extra]
    rc = compose_run_config([*common, *base])
    if rc.workload.arrival != "trace":
        return [*base, f"workload.rate={rate}"]
    times = [r.arrival_time for r in build_workload(rc.workload, rc.scheduler.max_model_len,
                                                    rc.model.vocab_size).requests]
    natural = (len(times) - 1) / max(max(times) - min(times), 1e-9)
    return [*base, f"workload.rate_scale={rate / natural:.6g}"]


def stats(source: str, ttft: np.ndarray, itl: np.ndarray) -> dict:
    itl = itl[~np.isnan(itl)]
    return {"source": source, "requests": len(ttft), "ttft_p50_ms": np.percentile(ttft, 50) * 1e3,
            "ttft_p90_ms": np.percentile(ttft, 90) * 1e3, "itl_p50_ms": np.percentile(itl, 50) * 1e3,
            "itl_p90_ms": np.percentile(itl, 90) * 1e3, "ttft_mean_ms": ttft.mean() * 1e3,
            "itl_mean_ms": itl.mean() * 1e3}


def own(requests_csv: Path, source: str) -> dict:
    frame = pd.read_csv(requests_csv)
    frame = frame[frame["finish_reason"] != "aborted"]
    return stats(source, frame["ttft"].to_numpy(float), frame["tpot"].to_numpy(float))


def served(overrides: list[str], run_dir: Path, model: str, requests, source: str) -> list[dict]:
    with ServerProcess([*overrides, "output.plots=false"], run_dir) as server:
        records = asyncio.run(replay(server.base_url, model, requests))
    errors = [r.error for r in records if r.error]
    if errors:
        raise RuntimeError(f"{source}: {len(errors)} requests failed, first: {errors[0]}")
    rows = [stats(f"{source}_client", np.array([r.ttft_s for r in records]),
                  np.array([np.nan if r.itl_s is None else r.itl_s for r in records]))]
    return rows + [own(run_dir / "requests.csv", f"{source}_own")]


def bench_one(args, name: str, load: float, out: Path) -> list[dict]:
    rate = load * args.capacity
    wl = workload_overrides(name, args.num_requests, rate, args.engine, args.workload)
    rc = compose_run_config([*args.engine, *wl])
    requests = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
    tag = f"{name}_{int(round(load * 100))}"
    run_dir = out / tag / "harness"
    subprocess.run([sys.executable, "-m", "harness", *args.engine, *wl, "output.plots=false",
                    f"hydra.run.dir={run_dir}"], check=True, stdout=subprocess.DEVNULL)
    rows = [own(run_dir / "requests.csv", "harness_run")]
    model = args.served_model or rc.engine.model.rstrip("/").split("/")[-1]
    rows += served(args.engine, out / tag / "engine_server", model, requests, "engine_server")
    rows += served(args.sim, out / tag / "sim_server", args.sim_model, requests, "sim_server")
    return [{"workload": name, "load": load, "rate_rps": rate, **row} for row in rows]


def markdown(frame: pd.DataFrame) -> str:
    cols = ["workload", "load", "source", "requests", "ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + " |"
              for row in frame[cols].itertuples(index=False)]
    lines += ["", "| workload | load | overhead per request (TTFT, ms) | overhead per token (ITL, ms) |",
              "|---|---|---|---|"]
    for (name, load), group in frame.groupby(["workload", "load"], sort=False):
        by = group.set_index("source")
        per_req = by.loc["engine_server_client", "ttft_mean_ms"] - by.loc["engine_server_own", "ttft_mean_ms"]
        per_tok = by.loc["engine_server_client", "itl_mean_ms"] - by.loc["engine_server_own", "itl_mean_ms"]
        lines.append(f"| {name} | {load} | {per_req:.2f} | {per_tok:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--capacity", type=float, required=True,
                        help="requests/s the engine sustains on these workloads (e.g. from a simulator plan)")
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 0.8])
    parser.add_argument("--workloads", type=lambda s: s.split(","), default=["azure", "mooncake"])
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--engine", nargs="*", default=["backend=engine", "model=qwen3-0.6b", "hardware=h100",
                                                        "backend.load_format=dummy"],
                        help="overrides of the engine's run and server")
    parser.add_argument("--sim", nargs="*", default=["backend=sim", "model=qwen3-0.6b", "hardware=h100"],
                        help="overrides of the simulator-backed server")
    parser.add_argument("--workload", nargs="*", default=[], help="more workload overrides (lengths, seed)")
    parser.add_argument("--sim-model", default="qwen3-0.6b", help="the model name the sim server serves")
    parser.add_argument("--served-model", default=None, help="the engine server's model name (default: folder)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown or args.capacity <= 0 or not all(0 < x for x in args.loads):
        parser.error(f"--workloads from {sorted(WORKLOADS)}, --capacity > 0, --loads > 0 (got {unknown or args})")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for name in args.workloads for load in args.loads for row in bench_one(args, name, load, args.out)]
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "serve.csv", index=False)
    (args.out / "serve.md").write_text(markdown(frame))
    print(markdown(frame))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
