"""The 200-stream timing run of tests/harness/serve/test_sim_timing.py with 1, 2, ... HTTP processes
(serve.api_servers), alternating in rounds so that every setting sees the same load on a shared machine.

    python -m experiments.serve.api_servers_pairs --api-servers 1 2 --rounds 8

Each run: the simulator-backed server (Qwen3-8B, simulated H100, time_scale=1) in its own process,
200 streams x 200 tokens from harness.serve.stream_counter in a thread at nice +10 (the test's
CLIENT_NICE); read from the server's serve_overhead.csv once it stopped (every HTTP process's
tokens): the send lag P50 / P99 / max / min in ms and the HTTP processes' CPU per token in us; beside
them the load average and the CPU the rest of the machine used meanwhile, in cores
(experiments.serve.lag_pairs.busy_s). At the end the median and range of each column per setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from experiments.serve.lag_pairs import busy_s, children_s, median_table

ONE_RUN = """
import json, sys, tempfile
import pandas as pd
from harness.serve.process import ServerProcess
from harness.serve.stream_counter import run_streams
from tests.harness.serve.conftest import SIM
from tests.harness.serve.test_sim_timing import CLIENT_NICE, STREAMS, TOKENS
overrides = [*SIM, "serve.time_scale=1", "serve.max_queue=512", "output.plots=false",
             f"serve.api_servers={sys.argv[1]}"]
bodies = [{"model": "qwen3-8b", "prompt": f"stream {i} " * 20, "max_tokens": TOKENS, "stream": True,
           "ignore_eos": True} for i in range(STREAMS)]
with ServerProcess(overrides, tempfile.mkdtemp()) as server:
    counts = run_streams(server.base_url, bodies, nice=CLIENT_NICE)
assert counts == [TOKENS + 1] * STREAMS, "a stream lost events"
row = pd.read_csv(server.run_dir / "serve_overhead.csv").iloc[0]
assert row["tokens"] == STREAMS * TOKENS, row["tokens"]
print(json.dumps({"p50_ms": row["send_lag_p50_ms"], "p99_ms": row["send_lag_p99_ms"], "max_ms": row["send_lag_max_ms"],
                  "min_ms": row["send_lag_min_ms"], "cpu_us_per_token": row["http_cpu_us_per_token"]}))
"""

COLUMNS = ["p50_ms", "p99_ms", "max_ms", "min_ms", "cpu_us_per_token", "other_cores"]
TARGET_P99_MS = 5.0


def one_run(api_servers: int) -> dict:
    load = os.getloadavg()[0]
    busy, ours, began = busy_s(), children_s(), time.perf_counter()
    here = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", ONE_RUN, str(api_servers)], cwd=here, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(here), os.environ.get(
                              "PYTHONPATH")]))}, timeout=600)
    other = ((busy_s() - busy) - (children_s() - ours)) / (time.perf_counter() - began)
    if done.returncode:
        raise RuntimeError(f"the run with serve.api_servers={api_servers} failed:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return {"load": load, "other_cores": other, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api-servers", type=int, nargs="+", default=[1, 2], help="the settings to alternate")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1 or any(not 1 <= n <= 64 for n in args.api_servers):
        parser.error(f"--rounds >= 1 and --api-servers each in [1, 64]; got {args.rounds}, {args.api_servers}")
    runs: dict[int, list[dict]] = {n: [] for n in args.api_servers}
    for i in range(args.rounds):
        for n in args.api_servers:
            row = one_run(n)
            runs[n].append(row)
            print(f"round {i + 1}, api_servers={n}: load {row['load']:.1f}, " +
                  ", ".join(f"{c} {row[c]:.2f}" for c in COLUMNS), flush=True)
    under = {n: f"{sum(r['p99_ms'] < TARGET_P99_MS for r in rows)} of {len(rows)}" for n, rows in runs.items()}
    print("\n".join(median_table("api_servers", runs, COLUMNS, {"runs with P99 under 5 ms": under})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
