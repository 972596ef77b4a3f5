"""The engine's server with 1, 2, ... HTTP processes (serve.api_servers) under aiperf at fixed
concurrencies: where one HTTP process becomes the bottleneck, and what more of them give.

    python -m experiments.serve.api_servers_gpu --out $OUT/api_servers --api-servers 1 4 --concurrency 128 512

For each setting one engine server (Qwen3-0.6B, random weights, the word tokenizer aiperf also reads:
experiments/serve/aiperf.server_text); against it, for each concurrency, aiperf at that concurrency for
--duration-s over requests of --isl random prompt ids and --osl outputs each (EOS ignored). Per case: aiperf's TTFT and
inter-token P50/P90 and output tokens/s; per server (its serve_overhead.csv once stopped): the HTTP
processes' CPU per token and the send lag P50/P99 (each step's end to its event with the socket).
Written: api_servers.csv and api_servers.md in --out, and each server's serve_overhead.csv.
"""

from __future__ import annotations

import argparse
import json
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from experiments.serve import aiperf
from harness.scripting import compose_run_config
from harness.serve.process import ServerProcess

ENGINE = ["backend=engine", "model=qwen3-0.6b", "backend.load_format=dummy"]
SERVER_COLUMNS = ["http_cpu_us_per_token", "send_lag_p50_ms", "send_lag_p99_ms"]


def one_server(api_servers: int, args: argparse.Namespace, cmd: list[str]) -> list[dict]:
    """Every concurrency against one server of api_servers HTTP processes."""
    folder = args.out / f"api_servers_{api_servers}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rc = compose_run_config(args.engine)
    vocab_size = rc.model.vocab_size
    words, extra = aiperf.server_text(rc, folder / "word_tokenizer")
    process = ServerProcess([*args.engine, *extra, "output.plots=false", "serve.max_queue=8192",
                             f"serve.api_servers={api_servers}"], folder)
    process.start(timeout_s=600)
    rows = []
    try:
        with urllib.request.urlopen(process.base_url + "/models") as response:
            model = json.load(response)["data"][0]["id"]
        for concurrency in args.concurrency:
            out = folder / f"aiperf_c{concurrency}"
            payloads = aiperf.write_payloads(folder / f"payloads_c{concurrency}.jsonl", model,
                                             requests(concurrency, args, vocab_size))
            report = aiperf.run(cmd, [*aiperf.base_args(process.base_url, model, words, out), "--input-file",
                                      str(payloads), "--custom-dataset-type", "mooncake_trace", "--concurrency",
                                      str(concurrency), "--benchmark-duration", str(args.duration_s),
                                      "--benchmark-grace-period", "60"], out, args.duration_s + 600)
            rows.append({"api_servers": api_servers, "concurrency": concurrency, **aiperf.figures(report),
                         "output_tok_s": float((report.get("output_token_throughput") or {}).get("avg", "nan")),
                         "errors": float((report.get("error_request_count") or {}).get("avg", 0))})
            print(f"api_servers={api_servers} concurrency={concurrency}: " +
                  ", ".join(f"{k} {v:.2f}" for k, v in rows[-1].items() if isinstance(v, float)), flush=True)
    finally:
        process.stop()
        shutil.rmtree(words)
    overhead = pd.read_csv(folder / "serve_overhead.csv").iloc[0]
    for row in rows:  # the server's, over every case it served
        row.update({c: float(overhead[c]) for c in SERVER_COLUMNS})
    for path in folder.iterdir():  # what comes back from a device: the summaries, not the tables
        if path.name != "serve_overhead.csv":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return rows


def requests(concurrency: int, args: argparse.Namespace, vocab_size: int) -> list[Request]:
    """More requests than the concurrency gets through in the duration (aiperf sends them in order, a
    new one as one ends): --isl random prompt ids (aiperf's own synthetic prompts are its corpus's
    words, which the word tokenizer does not know), --osl outputs each, EOS ignored."""
    rng = np.random.default_rng(concurrency)
    count = concurrency * 16
    return [Request(f"c{concurrency}-{i}", rng.integers(0, vocab_size, args.isl).tolist(),
                    SamplingParams(temperature=0.0, max_tokens=args.osl, ignore_eos=True), arrival_time=0.0)
            for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--api-servers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=512)
    parser.add_argument("--engine", nargs="*", default=ENGINE,
                        help="the server's overrides (default: Qwen3-0.6B's engine, random weights)")
    parser.add_argument("--aiperf", default=None, help="the aiperf command (default: $LOADGEN_AIPERF, or -m aiperf)")
    args = parser.parse_args(argv)
    if min(args.api_servers) < 1 or min(args.concurrency) < 1 or args.duration_s <= 0:
        parser.error("--api-servers and --concurrency must be >= 1, --duration-s > 0")
    cmd = aiperf.command(args.aiperf)
    aiperf.check(cmd)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for n in args.api_servers for row in one_server(n, args, cmd)]
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "api_servers.csv", index=False)
    text = markdown(table)
    (args.out / "api_servers.md").write_text(text)
    print(text)
    return 0


def markdown(table: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(table.columns) + " |", "|---" * len(table.columns) + "|"]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
