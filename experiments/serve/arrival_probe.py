"""How long a new request waits outside the simulator-backed server while streams are running, for
two versions of the server back to back (as lag_pairs: a checkout of the code before a change,
--base, and this one, alternating, so that both see the same load on a shared machine).

    python -m experiments.serve.arrival_probe --base /tmp/base --pairs 3

Each run: the simulator-backed server (Qwen3-0.6B, simulated H200 with its profile, time_scale=1,
steps of about 2 ms as in the GPU benchmark's Azure cases) in its own process, 24 streams of 1,500
tokens, and meanwhile 60 probe requests (100 prompt tokens, 2 outputs), one at a time on a new
connection, 0-50 ms apart. Per probe, the client's TTFT less the server's http_ttft is the time the
request spent outside the server's app (connection, kernel, the HTTP loop before it called the app)
and on its way back; printed per run: its P50 / P90 / mean, the probes' client TTFT and core TTFT,
the send lag P50 / P99 (GET /internal/state), the load average; at the end the median of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ONE_RUN = """
import asyncio, json, random, tempfile, time
from pathlib import Path
import httpx, numpy as np, pandas as pd
from experiments.serve.client import stream_one
from harness.serve.process import ServerProcess

def body(prompt, tokens):
    return {"model": "qwen3-0.6b", "prompt": prompt, "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}

async def load(base):
    streams = [asyncio.create_task(stream_one(base, body([5 + i] * 200, 1500), time.perf_counter()))
               for i in range(24)]
    await asyncio.sleep(0.3)
    ttfts, rng = [], random.Random(0)
    for _ in range(60):
        await asyncio.sleep(0.05 * rng.random())
        ttfts.append((await stream_one(base, body([7] * 100, 2), time.perf_counter())).ttft_s)
    await asyncio.gather(*streams)
    return ttfts

folder = Path(tempfile.mkdtemp())
with ServerProcess(["backend=sim", "model=qwen3-0.6b", "hardware=h200", "backend.cost_model=profiled",
                    "serve.time_scale=1", "output.plots=false", "serve.max_queue=512"], folder) as server:
    ttfts = np.array(asyncio.run(load(server.base_url))) * 1e3
    state = httpx.get(server.base_url.removesuffix("/v1") + "/internal/state").json()
requests = pd.read_csv(folder / "requests.csv")
probes = requests[requests.output_tokens == 2].sort_values("http_arrival")
outside = ttfts - probes.http_ttft.to_numpy() * 1e3
print(json.dumps({"outside_p50_ms": np.percentile(outside, 50), "outside_p90_ms": np.percentile(outside, 90),
                  "outside_mean_ms": outside.mean(), "client_ttft_p50_ms": np.percentile(ttfts, 50),
                  "core_ttft_p50_ms": probes.ttft.median() * 1e3, "send_lag_p50_ms": state["send_lag_p50_s"] * 1e3,
                  "send_lag_p99_ms": state["send_lag_p99_s"] * 1e3}))
"""

COLUMNS = ["outside_p50_ms", "outside_p90_ms", "outside_mean_ms", "client_ttft_p50_ms", "core_ttft_p50_ms",
           "send_lag_p50_ms", "send_lag_p99_ms"]


def one_run(code_dir: Path) -> dict:
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-c", ONE_RUN], cwd=code_dir, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(code_dir)}, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the run in {code_dir} failed:\n{done.stderr[-2000:]}")
    return {"load": load, **json.loads(done.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the code before the change")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args(argv)
    if not (args.base / "harness" / "serve").is_dir() or args.pairs < 1:
        parser.error(f"--base must be a checkout of this repository (got {args.base}); --pairs >= 1")
    here = Path(__file__).resolve().parents[2]
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    for i in range(args.pairs):
        for name, code_dir in (("base", args.base), ("new", here)):
            row = one_run(code_dir)
            runs[name].append(row)
            print(f"pair {i + 1} {name}: load {row['load']:.1f}, " +
                  ", ".join(f"{c} {row[c]:.2f}" for c in COLUMNS), flush=True)
    print("| version | " + " | ".join(f"{c} (median)" for c in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, rows in runs.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(r[c] for r in rows):.2f}" for c in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
