"""Cold start of the engine, the calibration of an autoscaled fleet's new replica (issue 36).

Each repeat starts a fresh process the way a data-parallel replica starts (multiprocessing spawn,
engine.replica_main) and times its phases: process (spawn to its imports done: the interpreter,
torch, the engine), load (the weights from the checkpoint folder; EngineExecutor.startup_s),
kv_cache (memory profiling, allocation), capture (CUDA graphs), warm_up, then first_token (one
16-token request to its first token); startup_s is spawn to ready (all but the first token), what
a replica takes before the router sends it traffic. Repeats, in order: --warm-up (one start that
fills Triton's kernel cache, kept in the CSV but not in the calibration), --repeats with the
weight files dropped from the page cache first (a load from disk), --cached with them in it.

Writes OUT/cold_start_<model>.csv (one row per repeat) and OUT/profiles/<hardware>/<model>.cold_start.json
(medians; harness.autoscale.calibration reads it from profiles/ once committed there).

  python -m experiments.autoscale.cold_start --model qwen3-8b --ckpt /tmp/ck/qwen3-8b --write-checkpoint \\
      --out $OUT/cold_start                                              # on a GPU
  python -m experiments.autoscale.cold_start --model tiny-qwen3 --ckpt /tmp/tiny --write-checkpoint \\
      --hardware cpu --repeats 1 --cached 1 --out /tmp/cold --set backend.device=cpu   # CPU check
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from experiments.autoscale import page_cache

PHASES = ("load", "kv_cache", "capture", "warm_up")
PROMPT_TOKENS = 16
GPU_NAMES = {"H100": "h100", "H200": "h200"}  # nvidia-smi's name -> conf/hardware


def gpu_hardware(min_gpus: int = 1) -> str:
    """The conf/hardware name of the machine's GPUs; exits in one line without min_gpus of a known kind."""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, check=True, timeout=60).stdout.split("\n")
    except (OSError, subprocess.SubprocessError) as error:
        raise SystemExit(f"error: nvidia-smi failed ({error}); without GPUs pass --hardware cpu (or --cpu)") from None
    names = [n.strip() for n in names if n.strip()]
    if len(names) < min_gpus:
        raise SystemExit(f"error: this needs {min_gpus} GPUs, the machine has {len(names)}: {names}")
    kinds = [conf for key, conf in GPU_NAMES.items() if key in names[0]]
    if not kinds:
        raise SystemExit(f"error: no conf/hardware for {names[0]!r}; known: {sorted(GPU_NAMES)} (pass --hardware)")
    return kinds[0]


def _child(spec: dict, conn) -> None:
    """The timed process; a failure goes back as one line."""
    up = time.time()
    try:
        _timed(spec, conn, up)
    except BaseException:
        import traceback

        from engine.worker_loop import error_line

        conn.send({"error": error_line(traceback.format_exc())})


def _timed(spec: dict, conn, up: float) -> None:
    """Imports, an EngineExecutor, one request to its first token."""
    import torch  # noqa: F401 (timed: a replica imports it before its engine)
    from transformers import AutoConfig  # noqa: F401 (the loader's first import: process time, not the load's)

    from engine.core import Request, SamplingParams, make_scheduler
    from engine.core.loop import WallClock, run
    from engine.executor import EngineExecutor
    from engine.weight_reader import resolve_mode

    imported = time.time()
    executor = EngineExecutor(spec["engine"], spec["scheduler"], spec["cache"])
    try:
        ready = time.time()
        info = executor.info()
        request = Request("probe", list(range(1, PROMPT_TOKENS + 1)), SamplingParams(max_tokens=1, ignore_eos=True))
        started = time.perf_counter()
        run(make_scheduler(spec["scheduler"], info, spec["cache"]), executor, [request], WallClock())
        first = time.perf_counter() - started
        conn.send({"up": up, "imported": imported, "ready": ready, "first_token_s": first, "device": info.device,
                   "num_blocks": info.num_blocks, "weights_s": executor.weights_load_s,
                   "weight_read": resolve_mode(spec["engine"].weight_read, executor.device),
                   **{f"{p}_s": executor.startup_s[p] for p in PHASES}})
    finally:
        executor.shutdown()


def start_once(spec: dict, timeout_s: float) -> dict:
    """One fresh process's phases (seconds)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    spawned = time.time()
    proc = ctx.Process(target=_child, args=(spec, child), name="cold-start-probe")
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout_s):
            raise RuntimeError(f"the probe process gave no answer in {timeout_s:.0f} s (exit code {proc.exitcode})")
        got = parent.recv()
    except EOFError:
        raise RuntimeError(f"the probe process exited (code {proc.exitcode}) before it was ready") from None
    finally:
        proc.join(60.0)
        if proc.is_alive():
            proc.kill()
    if "error" in got:
        raise SystemExit(f"error: the probe process failed: {got['error']}")
    row = {"interpreter_s": got.pop("up") - spawned, "process_s": got.pop("imported") - spawned}
    row["startup_s"] = got.pop("ready") - spawned
    row["total_s"] = row["startup_s"] + got["first_token_s"]
    return {**row, **got}


def probe(model: str, ckpt: Path, hardware: str, out: Path, repeats: int, cached: int, warm_up: bool,
          overrides: list[str], command: str, timeout_s: float = 900.0) -> dict:
    """The repeats of one model: its CSV and calibration JSON under out; returns the calibration."""
    import pandas as pd

    from harness.scripting import compose_run_config

    rc = compose_run_config(["backend=engine", f"model={model}", f"backend.model={ckpt}", *overrides])
    dummy = rc.engine.load_format == "dummy"
    spec = {"engine": rc.engine, "scheduler": rc.scheduler, "cache": rc.cache}
    size = page_cache.weight_bytes(ckpt) if not dummy else rc.model.weight_bytes_per_rank(1)
    out.mkdir(parents=True, exist_ok=True)
    kinds = ["warm-up"] * warm_up + ["disk"] * repeats + ["page cache"] * cached
    rows = []
    for i, kind in enumerate(kinds):
        if kind == "disk" and not dummy:
            page_cache.drop(ckpt)
        resident = page_cache.resident_fraction(ckpt) if not dummy else float("nan")
        print(f"[cold start] {model}: start {i + 1}/{len(kinds)} ({kind}, {100 * resident:.0f}% of the weights "
              "in the page cache)", flush=True)
        row = {"model": model, "hardware": hardware, "repeat": i, "kind": kind, "resident_before": resident,
               "weight_bytes": size, **start_once(spec, timeout_s)}
        row["setup_s"] = row["startup_s"] - row["process_s"] - sum(row[f"{p}_s"] for p in PHASES)
        row["load_bytes_per_s"] = size / row["load_s"]
        # the weight read alone (the load lap also holds the CUDA context, the model's allocation, the runner)
        row["weights_bytes_per_s"] = size / row["weights_s"] if row["weights_s"] else float("nan")
        rows.append(row)
        print(f"[cold start]   process {row['process_s']:.1f} s, load {row['load_s']:.1f} s "
              f"({row['load_bytes_per_s'] / 1e9:.2f} GB/s; the weights {row['weights_s'] or 0:.2f} s of it), "
              f"KV cache {row['kv_cache_s']:.1f} s, capture "
              f"{row['capture_s']:.1f} s, ready {row['startup_s']:.1f} s, first token {row['first_token_s']:.2f} s",
              flush=True)
        pd.DataFrame(rows).to_csv(out / f"cold_start_{model}.csv", index=False)  # kept if a later start fails
    calibration = summarize(rows, rc.engine.execution.tensor_parallel_size, command)
    path = out / "profiles" / hardware / f"{model}.cold_start.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(calibration, indent=2) + "\n")
    print(f"[cold start] {model}: {path}", flush=True)
    return calibration


def summarize(rows: list[dict], tp_size: int, command: str) -> dict:
    """Medians over the starts from disk (those from the page cache where there are none), the
    page-cache load bandwidth from the cached starts (from disk where there are none)."""
    disk = [r for r in rows if r["kind"] == "disk"]
    cached = [r for r in rows if r["kind"] == "page cache"]
    timed = disk or cached
    if not timed:
        raise ValueError("no timed start: --repeats and --cached are both 0")

    def median(key: str, of: list[dict]) -> float:
        return float(statistics.median(r[key] for r in of))

    for r in rows:  # the executor's set-up before its first timed phase: part of the start, in no phase
        r.setdefault("setup_s", r["startup_s"] - r["process_s"] - sum(r[f"{p}_s"] for p in PHASES))
    first = rows[0]
    return {"hardware": first["hardware"], "model": first["model"], "tp_size": tp_size, "device": first["device"],
            "weight_bytes": int(first["weight_bytes"]),
            **{k: median(k, timed) for k in ("interpreter_s", "process_s", "setup_s", "load_s", "kv_cache_s",
                                             "capture_s", "warm_up_s", "startup_s", "first_token_s")},
            "load_bytes_per_s": median("load_bytes_per_s", timed),
            "cached_load_bytes_per_s": median("load_bytes_per_s", cached or timed),
            **({"weights_s": median("weights_s", timed), "weights_bytes_per_s": median("weights_bytes_per_s", timed)}
               if all(r.get("weights_s") for r in timed) else {}),
            **({"weight_read": first["weight_read"]} if "weight_read" in first else {}),
            "starts_from_disk": len(disk), "starts_from_page_cache": len(cached),
            "measured": date.today().isoformat(), "command": command}


def check(args: argparse.Namespace) -> None:
    """Refuse bad settings in one line before anything starts."""
    if args.repeats < 0 or args.cached < 0 or args.repeats + args.cached < 1:
        raise SystemExit("error: --repeats and --cached must be >= 0, one of them >= 1")
    dummy = "backend.load_format=dummy" in args.set
    if not dummy and not args.write_checkpoint and not (args.ckpt / "config.json").is_file():
        raise SystemExit(f"error: --ckpt {args.ckpt} holds no checkpoint (config.json); pass --write-checkpoint")


def ensure_checkpoint(model: str, ckpt: Path) -> None:
    from engine.checkpoint import is_complete, write_checkpoint

    if not is_complete(ckpt):
        print(f"[cold start] writing a random-weight {model} checkpoint to {ckpt}", flush=True)
        started = time.perf_counter()
        write_checkpoint(model, ckpt, seed=0, dtype=None)
        print(f"[cold start]   written in {time.perf_counter() - started:.0f} s", flush=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="a conf/model name (qwen3-0.6b, qwen3-8b)")
    p.add_argument("--ckpt", type=Path, required=True, help="its checkpoint folder on local disk")
    p.add_argument("--write-checkpoint", action="store_true", help="write a random-weight checkpoint there first")
    p.add_argument("--hardware", default="auto", help="the conf/hardware name the calibration is filed under "
                   "(auto: the GPU's, from nvidia-smi)")
    p.add_argument("--repeats", type=int, default=2, help="starts with the weights dropped from the page cache")
    p.add_argument("--cached", type=int, default=1, help="starts with the weights in the page cache")
    p.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="no first start to compile kernels")
    p.add_argument("--set", action="append", default=[], help="a harness override (repeatable), e.g. "
                   "scheduler.max_num_seqs=64; backend.load_format=dummy times no load from disk")
    p.add_argument("--out", type=Path, required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    check(args)
    hardware = gpu_hardware() if args.hardware == "auto" else args.hardware
    if args.write_checkpoint:
        ensure_checkpoint(args.model, args.ckpt)
    command = "python -m experiments.autoscale.cold_start " + " ".join(argv if argv is not None else sys.argv[1:])
    probe(args.model, args.ckpt, hardware, args.out, args.repeats, args.cached, args.warm_up, args.set, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
