"""aiperf (NVIDIA's load generator, from the package index) run as a subprocess against a server.

One place for how the project drives it: the CPU tests (tests/harness/serve/test_loadgen.py, a
synthetic load at a fixed concurrency) and the GPU benchmark (experiments/serve/bench_serve.py
--loadgen aiperf, a workload's own requests at their arrival times) both build their command here.

The command is `$LOADGEN_AIPERF` (a path to aiperf, or a command line such as
`env PYTHONPATH=/tmp/loadgen python3 -m aiperf`), else this interpreter's `-m aiperf`. aiperf pins
pandas<3, which the project's pandas 3 excludes, so on a CPU it lives in a venv of its own; on the
device its wheels are installed into a folder of their own (docs/serving.md#load-generators).

Replaying a workload: each request's body (experiments/serve/client.request_body: its prompt token
ids, max_tokens, sampling, ignore_eos, streamed with usage) goes into a Mooncake JSONL line as
`payload`, which aiperf sends verbatim, at `timestamp` (ms) with --fixed-schedule. aiperf times a
token only when its event carries text; a random-weight model's ids mostly have none in the
project's 512-id tokenizer, so the engine's server is given a word tokenizer of the model's whole
vocabulary (write_word_tokenizer: every id one word, decoded by the same incremental decoder).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.request import Request
from experiments.serve.client import request_body
from harness.config import RunConfig

ENV_VAR = "LOADGEN_AIPERF"
REPORT = "profile_export_aiperf.json"  # the aggregate report
RECORDS = "profile_export.jsonl"  # one line per request


def command(given: str | None = None) -> list[str]:
    """The command that runs aiperf: given, else $LOADGEN_AIPERF, else `python -m aiperf`."""
    text = given or os.environ.get(ENV_VAR)
    return shlex.split(text) if text else [sys.executable, "-m", "aiperf"]


def check(cmd: Sequence[str]) -> None:
    """Raise RuntimeError in one line when cmd cannot run aiperf (before any GPU work)."""
    try:
        done = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=120, env=_env())
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"aiperf does not run as {shlex.join(cmd)}: {error}") from None
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"aiperf does not run as {shlex.join(cmd)} (set ${ENV_VAR}): {last[0]}")


def base_args(base_url: str, model: str, tokenizer: str | Path, out: Path) -> list[str]:
    """`aiperf profile` against base_url's streaming /v1/completions, token counts from the
    server's usage, the reports in out."""
    return ["profile", "--model", model, "--url", base_url.removesuffix("/v1"), "--endpoint-type", "completions",
            "--streaming", "--tokenizer", str(tokenizer), "--random-seed", "0", "--use-server-token-count",
            "--ui-type", "none", "--artifact-dir", str(out), "--no-server-metrics", "--no-gpu-telemetry"]


def synthetic_args(concurrency: int, duration_s: float, isl: int, osl: int) -> list[str]:
    """aiperf's own synthetic prompts of isl tokens, osl outputs each, at a fixed concurrency."""
    return ["--concurrency", str(concurrency), "--benchmark-duration", str(duration_s),
            "--benchmark-grace-period", "60", "--synthetic-input-tokens-mean", str(isl),
            "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(osl),
            "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true"]


def trace_args(path: Path) -> list[str]:
    """The requests of write_payloads' file, each sent at its timestamp."""
    return ["--input-file", str(path), "--custom-dataset-type", "mooncake_trace", "--fixed-schedule"]


def run(cmd: Sequence[str], args: list[str], out: Path, timeout_s: float) -> dict:
    """Run aiperf; its aggregate report (metric -> {unit, avg, p50, p90, ...}, times in ms)."""
    # aiperf leaves its IPC sockets' and dataset's temporary folders behind; given a TMPDIR of its
    # own, they go when the run ends
    with tempfile.TemporaryDirectory(prefix="aiperf_") as scratch:
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout_s,
                              env=_env() | {"TMPDIR": scratch})
    if done.returncode != 0:
        raise RuntimeError(f"aiperf failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads((out / REPORT).read_text())


def _env() -> dict[str, str]:
    # aiperf's offline mode looks a local tokenizer folder up in the hub cache; online it loads the path
    return {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}


def setup_s(out: Path) -> tuple[float, float]:
    """How long aiperf took to set up before its first request, and of that its tokenizer's load (its
    log's "All services configured in X seconds", "Tokenizer(s) configured in X seconds"); NaN where
    the log does not say. On one H100 host the tokenizer took 12-17 s of every case's 13-19 s
    (experiments/serve/h100_run5_aiperf/), against 1-2 s on a CPU box: printed per case, so a run shows it."""
    log = out / "logs" / "aiperf.log"
    text = log.read_text() if log.is_file() else ""
    def seconds(what: str) -> float:
        found = re.search(rf"{what} configured in ([0-9.]+) seconds", text)
        return float(found.group(1)) if found else float("nan")

    return seconds("All services"), seconds(r"Tokenizer\(s\)")


def write_payloads(path: Path, model: str, requests: Sequence[Request]) -> Path:
    """requests as Mooncake JSONL lines {timestamp: ms after the first, payload: the request's body}."""
    start = min(r.arrival_time for r in requests)
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps({"timestamp": (r.arrival_time - start) * 1e3, "payload": request_body(model, r)}) + "\n")
    return path


def write_word_tokenizer(out: Path, vocab_size: int, max_len: int) -> Path:
    """A tokenizer folder (tokenizer.json, tokenizer_config.json) whose every id below vocab_size
    decodes to one word, ` w<id>`: what a served random-weight model's tokens read as."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)} | {"<unk>": vocab_size}  # a special above the model's ids
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, "unk_token": "<unk>",
              "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


def server_text(rc: RunConfig, folder: Path) -> tuple[Path, list[str]]:
    """The word tokenizer for rc's model (written to folder; aiperf is given it too) and the server
    overrides that make the engine's server decode with it (the simulator's writes words already)."""
    words = write_word_tokenizer(folder, rc.model.vocab_size, rc.scheduler.max_model_len)
    return words, [f"serve.tokenizer={words}"] if rc.backend == "engine" else []


def records(out: Path, requests: Sequence[Request]) -> pd.DataFrame:
    """aiperf's per-request records as the in-repo client's (ttft_s, itl_s, tokens, late_s, error):
    late_s is how much later than the most punctual request each started, against its schedule."""
    due = np.array([r.arrival_time for r in requests]) - min(r.arrival_time for r in requests)
    rows = []
    for line in (out / RECORDS).read_text().splitlines():
        record = json.loads(line)
        meta, metrics = record["metadata"], record.get("metrics", {})
        value = lambda name: metrics.get(name, {}).get("value", np.nan)  # noqa: E731
        rows.append({"session": meta["session_num"], "start_ns": meta["request_start_ns"],
                     "ttft_s": value("time_to_first_token") / 1e3, "itl_s": value("inter_token_latency") / 1e3,
                     "tokens": value("output_sequence_length"),
                     "error": json.dumps(record["error"]) if record.get("error") else None})
    frame = pd.DataFrame(rows).sort_values("session", ignore_index=True)
    if len(frame) != len(requests) or list(frame["session"]) != list(range(len(requests))):
        raise RuntimeError(f"aiperf recorded {len(frame)} requests of {len(requests)}")
    offset = (frame["start_ns"].to_numpy(float) - frame["start_ns"].min()) / 1e9 - due
    frame["late_s"] = offset - offset.min()
    return frame.drop(columns=["start_ns"])


def figures(report: dict) -> dict:
    """aiperf's own TTFT and inter-token P50/P90/mean (ms) from its aggregate report, in the
    benchmark's column names (experiments/serve/tables.LATENCY)."""
    row = {}
    for name, metric in (("ttft", "time_to_first_token"), ("itl", "inter_token_latency")):
        stats = report.get(metric) or {}
        for key, column in (("p50", "p50"), ("p90", "p90"), ("avg", "mean")):
            row[f"{name}_{column}_ms"] = float(stats.get(key, np.nan))
    return row


def replay(cmd: Sequence[str], base_url: str, model: str, requests: Sequence[Request], tokenizer: Path,
           folder: Path, tag: str) -> tuple[pd.DataFrame, dict]:
    """requests replayed by aiperf at their arrival times: its per-request records (records()) and
    its figures(); its reports are kept in folder/aiperf_<tag>/."""
    out = folder / f"aiperf_{tag}"
    trace = write_payloads(folder / f"payloads_{tag}.jsonl", model, requests)
    span = max(r.arrival_time for r in requests) - min(r.arrival_time for r in requests)
    report = run(cmd, [*base_args(base_url, model, tokenizer, out), *trace_args(trace)], out, span + 600)
    trace.unlink()  # the requests are the workload's, made again from its overrides
    errors = (report.get("error_request_count") or {}).get("avg", 0)
    if errors:
        raise RuntimeError(f"aiperf {tag}: {errors:.0f} requests failed: {report.get('error_summary')}")
    return records(out, requests), figures(report)
