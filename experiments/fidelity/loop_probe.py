"""Where a served run's steps spend their time, against a saved fit, kind of step by kind of step.

The grid times each shape back to back; a served run puts the scheduler, the recorders and the
loop between steps, and small-batch decode steps are close to host-bound. This serves one
workload class on the engine (harness.fidelity.classes, at a rate or offline), records every step
and splits its time by kind of step (harness.compare.tables.replay: the step's device span, the
device's idle gap before it, the host time of its submit(), the fit's price of each), with every
garbage collection of the run timed (gc.callbacks). Then it times a few decode shapes the way the
grid does (time_plan_overlapped) on the same machine, so the fit's machine and this one can be
told apart.

    python experiments/fidelity/loop_probe.py --model qwen3-0.6b \
        --fit experiments/fidelity/h100_lead/profile_model.csv.gz \
        --workload conversation --rates 0,30.7,49.1 --out $OUT/loop

Each cell is served twice: with Python's garbage collector as the engine runs it, and with it off.
The runner's step timer (engine.step_timing) splits each decode step's submit() into its phases, and
the last cell is served once more under cProfile. Writes steps.csv.gz (the replay, every step),
gc.csv (collections), grid.csv, host_profile.txt and summary.txt."""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from engine.step_timing import StepTimer
from harness.calibration.profiling import time_plan_overlapped
from harness.compare.tables import replay
from harness.fidelity import classes
from harness.run import make_executor, run_once
from harness.scripting import compose_run_config, probe_grid, probe_plan
from harness.shared_executor import KeepAlive
from sim.profiled import ProfiledCostModel

GRID_BATCHES = (8, 16, 32, 64)
GRID_CONTEXT = 1000
BATCH_BUCKETS = (0, 8, 16, 32, 64, 128, 512)
STALL_S = 0.05


class GcTimer:
    """Every collection's generation and wall time, through gc.callbacks, while installed."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.rows.append({"at_s": self._started, "generation": info["generation"],
                              "pause_s": time.perf_counter() - self._started})

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def step_summary(steps: pd.DataFrame) -> pd.DataFrame:
    """Per kind of step (decode by batch bucket): means in ms of span, idle gap, launch and price."""
    kind = np.where(steps["kind"] == "decode",
                    "decode " + pd.cut(steps["num_seqs"], BATCH_BUCKETS).astype(str),
                    np.where(steps["cuda_graph"] == 1, "prefill graph", "prefill eager"))
    grouped = steps.assign(group=kind).groupby("group")
    ms = lambda column: (column, lambda x: 1e3 * x.mean())  # noqa: E731
    return grouped.agg(steps=("step", "size"), span_ms=ms("measured_execute_s"), idle_ms=ms("measured_host_s"),
                       stalls=("measured_host_s", lambda x: int((x > STALL_S).sum())),
                       launch_ms=ms("launch_s"), priced_ms=ms("predicted_execute_profiled_s"),
                       priced_with_host_ms=ms("predicted_profiled_s")).round(3)


def grid_rows(executor, sched, model: ProfiledCostModel) -> list[dict]:
    """Decode shapes timed as the grid times them, on this machine, beside the fit's price, with
    the host time of each phase of their submit()."""
    from sim.features import step_features

    rows = []
    for batch in GRID_BATCHES:
        plan = probe_plan(executor, sched, [(1, GRID_CONTEXT, True)] * batch)
        executor.runner.timer = timer = StepTimer(executor.device)
        try:
            timing = time_plan_overlapped(executor, plan, probe_grid())
        finally:
            executor.runner.timer = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            priced = model.predict(pd.DataFrame([step_features(plan, executor.info().graph_sizes)]))[0]
        phases = pd.DataFrame(timer.records)
        rows.append({"batch": batch, "context": GRID_CONTEXT, "span_ms": 1e3 * statistics.median(timing.durations),
                     "launch_ms": 1e3 * timing.launch_s, "gpu_ms": 1e3 * (timing.gpu_s or float("nan")),
                     "fit_ms": 1e3 * priced,
                     **{f"{c[:-2]}_ms": 1e3 * phases[c].median() for c in phases.columns if c.startswith("host_")}})
    return rows


def phase_summary(records: list[dict]) -> str:
    """Host time per phase of submit() (engine.step_timing), decode steps by batch bucket, in ms."""
    frame = pd.DataFrame(records)
    if frame.empty or not (frame["graph_size"] > 0).any():
        return "no decode graph steps"
    frame = frame[frame["graph_size"] > 0]
    group = pd.cut(frame["num_seqs"], BATCH_BUCKETS).astype(str)
    host = [c for c in frame.columns if c.startswith("host_")]
    means = (1e3 * frame.groupby(group)[host].mean()).round(3).rename(columns=lambda c: f"{c[:-2]}_ms")
    return means.assign(steps=frame.groupby(group).size()).to_string()


def serve(executor, rc, model: ProfiledCostModel, collect_garbage: bool,
          profile: cProfile.Profile | None = None) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    """One engine run of rc: its summary line with the step table, the replay and the collections."""
    paused = not collect_garbage and gc.isenabled()
    executor.runner.timer = timer = StepTimer(executor.device)  # an EngineExecutor: the probe is the engine's
    if paused:
        gc.disable()
    try:
        with GcTimer() as collections:
            if profile is not None:
                profile.enable()
            outcome = run_once(rc, False, executor=KeepAlive(executor), label="loop probe", record=True)
            if profile is not None:
                profile.disable()
    finally:
        if paused:
            gc.enable()
        executor.runner.timer = None
    steps = outcome.steps
    # launch_s: host time of submit(), recorded where steps overlap (CUDA)
    launches = steps["launch_s"] if "launch_s" in steps.columns else np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a held-out class may lie outside the fit's ranges
        replayed = replay(steps, {"profiled": model}).assign(launch_s=launches)
    pauses = pd.DataFrame(collections.rows, columns=["at_s", "generation", "pause_s"])
    s = outcome.summary
    workload = rc.workload
    rate = {"trace": f"x{workload.rate_scale:.3g}", "offline": ""}.get(workload.arrival, f"{workload.rate} req/s")
    head = (f"{workload.name}, {workload.arrival} {rate}, {s['num_submitted']} requests, garbage collector "
            f"{'on' if collect_garbage else 'off'}: TPOT P50 {1e3 * s['tpot_p50_s']:.3f} ms, "
            f"P90 {1e3 * s['tpot_p90_s']:.3f} ms, TTFT P50 {1e3 * s['ttft_p50_s']:.2f} ms, "
            f"P90 {1e3 * s['ttft_p90_s']:.2f} ms, output {s['output_tok_s']:.0f} tok/s")
    pause_ms = pauses.groupby("generation")["pause_s"].agg(["count", "sum", "max"]).mul([1, 1e3, 1e3]).round(2)
    text = "\n".join([head, step_summary(replayed).to_string(),
                      "garbage collections (count, total and longest pause, ms):",
                      pause_ms.to_string() if len(pauses) else "none",
                      "host ms per phase of a decode step's submit():", phase_summary(timer.records), ""])
    return text, replayed, pauses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", help="conf/model name (its random-weight checkpoint)")
    parser.add_argument("--fit", type=Path, required=True, help="a saved profiled model (profile_model.csv)")
    parser.add_argument("--workload", default="conversation", choices=classes.CLASSES)
    parser.add_argument("--rates", default="0", help="comma-separated requests per second; 0: offline")
    parser.add_argument("--num-requests", type=int, default=80)
    parser.add_argument("--num-blocks", type=int, default=None, help="KV blocks (pinned); none: the engine's")
    parser.add_argument("--length-scale", type=float, default=1.0, help="the classes' lengths x this (CPU: 1/16)")
    parser.add_argument("--override", action="append", default=[], help="a Hydra override (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rc = compose_run_config([f"model={args.model}", "backend=engine", "scheduler.max_model_len=16384",
                             *([f"cache.num_blocks={args.num_blocks}"] if args.num_blocks else []), *args.override])
    base = classes.class_run_config(rc, args.workload, args.num_requests, args.length_scale, 400)
    executor = make_executor(base)
    model = ProfiledCostModel.load(args.fit, executor.info().graph_sizes)
    texts, replays, collections = [], [], []
    try:
        for rate in rates:
            cell = base if rate == 0 else classes.with_rate(base, args.workload, rate)
            for collect_garbage in (True, False):
                text, replayed, pauses = serve(executor, cell, model, collect_garbage)
                print(text)
                texts.append(text)
                tags = {"rate": rate, "gc": collect_garbage}
                replays.append(replayed.assign(**tags))
                collections.append(pauses.assign(**tags))
        grid = pd.DataFrame(grid_rows(executor, base.scheduler, model))
        profile = cProfile.Profile()  # the last cell once more, under the profiler
        serve(executor, cell, model, True, profile)
    finally:
        executor.shutdown()
    pd.concat(replays).to_csv(args.out / "steps.csv.gz", index=False)
    pd.concat(collections).to_csv(args.out / "gc.csv", index=False)
    grid.to_csv(args.out / "grid.csv", index=False)
    texts += ["grid timing on this machine against the fit:", grid.round(3).to_string(index=False)]
    functions = io.StringIO()
    pstats.Stats(profile, stream=functions).sort_stats("tottime").print_stats(30)
    (args.out / "host_profile.txt").write_text(functions.getvalue())
    text = "\n".join(texts) + "\n"
    (args.out / "summary.txt").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
