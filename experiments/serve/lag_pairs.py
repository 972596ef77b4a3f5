"""The 200-stream timing run of tests/harness/serve/test_sim_timing.py, for two versions of the server
back to back: a checkout of the code before a change (--base, e.g. `git worktree add /tmp/base
<commit>` or `git archive <commit> | tar -x -C /tmp/base`) and this one, alternating, so that both
see the same load on a shared machine.

    python -m experiments.serve.lag_pairs --base /tmp/base --pairs 5
    python -m experiments.serve.lag_pairs --base /tmp/base --pairs 8 --pytest   # the test itself

Each run: the simulator-backed server (Qwen3-8B, simulated H100, time_scale=1) in its own process,
200 streams x 200 tokens from harness.serve.stream_counter, the clients in a thread at the nice value
the checkout's test gives them (CLIENT_NICE; 0 before it had one) or --client-nice (the same in
both: `--client-nice 10` leaves the server's change alone to compare); printed per run: the send lag
P50 / P99 / max and min (how early: serve.max_early_ms; 0 where the checkout has no min), the
dispatch lag P99 (GET /internal/state), the largest lag of the first and of the last 200 tokens
sent (the burst's first tokens, the finishing step's; GET /internal/send_lags, nan before it), the
HTTP process's CPU per token, the load average and the CPU the rest of the machine used meanwhile,
in cores (/proc/stat's busy time less this script's children's: other sessions' work on a shared
box); at the end the median and range of each column
per version. --pytest runs the test itself in each checkout instead (its own clients and settings)
and reads the line it prints (no dispatch lag there).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ONE_RUN = """
import asyncio, json, os, sys, tempfile, threading
from concurrent.futures import ThreadPoolExecutor
import httpx
from harness.serve.process import ServerProcess
from harness.serve.stream_counter import count_streams
from tests.harness.serve.test_sim_timing import STREAMS, TOKENS
from tests.harness.serve.conftest import SIM
nice = sys.argv[1]
if not nice:
    try:
        from tests.harness.serve.test_sim_timing import CLIENT_NICE as nice
    except ImportError:  # a checkout before the clients' nice value
        nice = 0
nice = int(nice)

def clients(base_url, bodies):  # in a thread of their own at that nice value, as run_streams
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    return asyncio.run(count_streams(base_url, bodies))

with ServerProcess([*SIM, "serve.time_scale=1", "serve.max_queue=512", "output.plots=false"],
                   tempfile.mkdtemp()) as server:
    url = server.base_url.removesuffix("/v1") + "/internal/state"
    before = httpx.get(url).json()
    bodies = [{"model": "qwen3-8b", "prompt": f"stream {i} " * 20, "max_tokens": TOKENS, "stream": True,
               "ignore_eos": True} for i in range(STREAMS)]
    with ThreadPoolExecutor(1) as pool:
        counts = pool.submit(clients, server.base_url, bodies).result()
    state = httpx.get(url).json()
    lags = httpx.get(url.removesuffix("state") + "send_lags")  # 404 in a checkout before the route
head = tail = float("nan")
if lags.status_code == 200:  # the tokens sent first (the burst's first ones) and last (the finishing step's)
    sent = lags.json()
    head, tail = max(sent[:STREAMS]) * 1e3, max(sent[-STREAMS:]) * 1e3
assert counts == [TOKENS + 1] * STREAMS, "a stream lost events"
print(json.dumps({"p50_ms": state["send_lag_p50_s"] * 1e3, "p99_ms": state["send_lag_p99_s"] * 1e3,
                  "max_ms": state["send_lag_max_s"] * 1e3, "min_ms": state.get("send_lag_min_s", 0.0) * 1e3,
                  "dispatch_p99_ms": state["lag_p99_s"] * 1e3, "client_nice": nice,
                  "first_max_ms": head, "last_max_ms": tail,
                  "cpu_us_per_token": (state["http_cpu_s"] - before["http_cpu_s"]) / (STREAMS * TOKENS) * 1e6}))
"""

COLUMNS = ["p50_ms", "p99_ms", "max_ms", "min_ms", "dispatch_p99_ms", "first_max_ms", "last_max_ms",
           "cpu_us_per_token", "other_cores"]


def busy_s() -> float:
    """The machine's busy CPU seconds so far (user, nice, system, irq, softirq); nan off Linux."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(v) for v in stat.readline().split()[1:8]]
    except OSError:
        return math.nan
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def children_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # the run's processes, once waited for
    return usage.ru_utime + usage.ru_stime


# one HTTP process (the test's other case, serve.api_servers=2, is api_servers_pairs' to compare)
TEST = ["-m", "pytest", "-m", "slow", "-s", "-q", "-p", "no:cacheprovider", "-k",
        "keep_to_the_schedule and not two_http_processes", "tests/harness/serve/test_sim_timing.py"]
# the test's printed line: "send lag over N tokens: P50 x ms, P99 y ms (...), max z ms; [early: min w ms, ...]
# HTTP process CPU c us per token"
TEST_LINE = re.compile(r"P50 (?P<p50_ms>-?[\d.]+) ms, P99 (?P<p99_ms>-?[\d.]+) ms .*?max (?P<max_ms>-?[\d.]+) ms"
                       r"(?:; early: min (?P<min_ms>-?[\d.]+) ms)?.*?CPU (?P<cpu_us_per_token>[\d.]+) us per token")


def one_run(code_dir: Path, client_nice: int | None, pytest: bool) -> dict:
    """One run in code_dir: ONE_RUN, or (pytest) the test itself, its printed line read."""
    load = os.getloadavg()[0]
    busy, ours, began = busy_s(), children_s(), time.perf_counter()
    nice = "" if client_nice is None else str(client_nice)
    done = subprocess.run([sys.executable, *(TEST if pytest else ["-c", ONE_RUN, nice])], cwd=code_dir,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(code_dir)}, timeout=600)
    other = ((busy_s() - busy) - (children_s() - ours)) / (time.perf_counter() - began)
    if done.returncode:
        raise RuntimeError(f"the run in {code_dir} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    row: dict = {"load": load, "other_cores": other}
    if not pytest:
        return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}
    match = TEST_LINE.search(done.stdout)
    if match is None:
        raise RuntimeError(f"no lag line in the test's output in {code_dir}:\n{done.stdout[-2000:]}")
    values = {k: float(v) for k, v in match.groupdict(default="0").items()}
    return {**row, **values, "dispatch_p99_ms": math.nan, "first_max_ms": math.nan, "last_max_ms": math.nan}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the code before the change")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--client-nice", type=int, default=None,
                        help="the clients' nice value in both versions (default: each checkout's test's, 0 "
                             "before it had one)")
    parser.add_argument("--pytest", action="store_true",
                        help="run the test itself in each checkout (its own clients) and read its printed line")
    args = parser.parse_args(argv)
    if args.pytest and args.client_nice is not None:
        parser.error("--client-nice applies to this script's own run, not to --pytest's")
    if not (args.base / "harness" / "serve").is_dir() or args.pairs < 1:
        parser.error(f"--base must be a checkout of this repository (got {args.base}); --pairs >= 1")
    if args.client_nice is not None and not 0 <= args.client_nice <= 19:
        parser.error(f"--client-nice must be in [0, 19], got {args.client_nice}")
    here = Path(__file__).resolve().parents[2]
    runs: dict[str, list[dict]] = {"base": [], "new": []}
    for i in range(args.pairs):
        for name, code_dir in (("base", args.base), ("new", here)):
            row = one_run(code_dir, args.client_nice, args.pytest)
            runs[name].append(row)
            clients = "the test's clients" if args.pytest else f"clients at nice +{row['client_nice']}"
            print(f"pair {i + 1} {name}: load {row['load']:.1f}, {clients}, " +
                  ", ".join(f"{c} {row[c]:.2f}" for c in COLUMNS), flush=True)
    print("\n".join(median_table("version", runs, COLUMNS)))
    return 0


def median_table(label: str, runs: dict, columns: list[str],
                 extra: dict[str, dict] | None = None) -> list[str]:
    """A markdown table, one row per key of runs (its runs' rows): each column's median and range;
    extra: more columns first, a cell per key."""
    extra = extra or {}
    lines = ["| " + " | ".join([label, *extra, *(f"{c} median (range)" for c in columns)]) + " |",
             "|---" * (1 + len(extra) + len(columns)) + "|"]
    for key, rows in runs.items():
        cells = [f"{statistics.median(r[c] for r in rows):.1f} ({min(r[c] for r in rows):.1f}-"
                 f"{max(r[c] for r in rows):.1f})" for c in columns]
        lines.append("| " + " | ".join([str(key), *(cell[key] for cell in extra.values()), *cells]) + " |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
