"""Calibrate the profiled cost model on the GPU, then compare the simulator with the engine on the
target workloads, with one loaded engine (one process: the model is loaded and its graphs
captured once).

  PYTHONPATH=. python experiments/calibration/calibrate_and_compare.py --model qwen3-0.6b \
      --checkpoint /tmp/q06 --out OUT/qwen3-0.6b_h100 [--grid full] [--workloads bench poisson azure]

Stages, each written as soon as it is done (a stage is skipped once --deadline-s has passed):
1. profile.csv: harness.profiling over the grid (rows "grid") and random shapes (rows "random");
2. calibration/: a real run of a calibration workload (bench lengths, seed 1, short outputs, so
   decode batches span 1..max_num_seqs), steps recorded with host times; then
   calibration_online/: an online one, a later window of the Azure conversation trace (rows from
   --online-calibration-start, which no target uses), so that the fit sees the small prefills
   and ragged decodes that arrivals make, as they run in the serving loop;
3. model.csv (fitted: executor time on the grid, host time on the calibration steps) and
   validation.csv (held-out errors: grid split, random shapes, the calibration run's steps);
4. compare_<workload>/: harness.compare against model.csv: bench (nano-vllm's, offline), poisson
   (bench lengths at 70% of the engine's offline request throughput measured in stage 4's bench),
   azure (the first --azure-requests rows of the Azure conversation trace, arrivals / --azure-rate-scale);
5. meta.json: command, device, date, versions, stage times.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from harness.calibration import validate  # noqa: E402
from harness.compare import CompareConfig, KeepAlive, compare  # noqa: E402
from harness.config import CONF_DIR, build_run_config  # noqa: E402
from harness.profiling import ProfileGrid, profile_executor  # noqa: E402
from harness.recording import graph_sizes_of  # noqa: E402
from harness.run import make_executor, run_once, write_outcome  # noqa: E402

log = logging.getLogger("calibrate")


def run_config(base: list[str], extra: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return build_run_config(compose(config_name="config", overrides=base + extra))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="conf/model name (the simulator's spec), e.g. qwen3-0.6b")
    parser.add_argument("--checkpoint", required=True, help="checkpoint folder the engine loads")
    parser.add_argument("--hardware", default="h100", help="conf/hardware name for the roofline model")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grid", choices=("full", "quick"), default="full")
    parser.add_argument("--num-random", type=int, default=None, help="random held-out shapes (default: the grid's)")
    parser.add_argument("--max-seconds-per-shape", type=float, default=None)
    parser.add_argument("--prefill-tokens", type=int, nargs="+", default=None, help="grid: total prefill tokens")
    parser.add_argument("--prefill-contexts", type=int, nargs="+", default=None, help="grid: cached tokens per chunk")
    parser.add_argument("--eager-bench", action="store_true",
                        help="also compare the bench with CUDA graphs bypassed (decode_eager regime)")
    parser.add_argument("--device", default="auto", help="backend.device (cpu for a dry run)")
    parser.add_argument("--calibration-requests", type=int, default=512)
    parser.add_argument("--workloads", nargs="*", default=["bench", "poisson", "azure"],
                        choices=("bench", "poisson", "azure"))
    parser.add_argument("--bench-requests", type=int, default=256)
    parser.add_argument("--poisson-requests", type=int, default=512)
    parser.add_argument("--poisson-load", type=float, default=0.7, help="fraction of the offline request throughput")
    parser.add_argument("--azure-requests", type=int, default=600)
    parser.add_argument("--azure-rate-scale", type=float, default=1.0)
    parser.add_argument("--trace-dir", default=None, help="folder of azure_conv_2023.csv (default ../shared/traces)")
    parser.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every run")
    parser.add_argument("--online-calibration-start", type=int, default=10_000,
                        help="first Azure trace row of the online calibration run (its rows: --azure-requests)")
    parser.add_argument("--no-online-calibration", action="store_true")
    parser.add_argument("--deadline-s", type=float, default=450.0, help="start no stage after this many seconds")
    parser.add_argument("--git-commit", default="unknown")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    started = time.perf_counter()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    base = ["experiment=compare", f"model={args.model}", f"hardware={args.hardware}", f"backend.model={args.checkpoint}",
            f"backend.device={args.device}", "output.progress=false", *args.extra]
    meta = {"command": " ".join(sys.argv), "git_commit": args.git_commit, "overrides": base,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "stages": {}}

    def stage_done(name: str, t0: float, **info) -> None:
        meta["stages"][name] = {"seconds": round(time.perf_counter() - t0, 1), **info}
        (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
        log.info("stage %s done in %.1f s (%.0f s elapsed)", name, time.perf_counter() - t0,
                 time.perf_counter() - started)

    def time_left() -> bool:
        return time.perf_counter() - started < args.deadline_s

    t0 = time.perf_counter()
    rc = run_config(base, [])
    executor = make_executor(rc)
    import torch

    sizes = graph_sizes_of(executor, rc)
    meta.update(torch=torch.__version__, device=torch.cuda.get_device_name() if executor.device.type == "cuda" else "cpu",
                num_blocks=executor.kv_cache_spec().num_blocks, graph_batch_sizes=list(sizes.decode),
                prefill_graph_sizes=list(sizes.prefill),
                engine_config=dataclasses.asdict(rc.engine), scheduler=dataclasses.asdict(rc.scheduler))
    stage_done("load", t0)
    shared = KeepAlive(executor)
    try:
        t0 = time.perf_counter()
        grid = ProfileGrid() if args.grid == "full" else ProfileGrid.quick()
        if args.num_random is not None:
            grid = dataclasses.replace(grid, num_random=args.num_random)
        if args.max_seconds_per_shape is not None:
            grid = dataclasses.replace(grid, max_seconds_per_shape=args.max_seconds_per_shape)
        if args.prefill_tokens:
            grid = dataclasses.replace(grid, prefill_tokens=tuple(args.prefill_tokens))
        if args.prefill_contexts:
            grid = dataclasses.replace(grid, prefill_contexts=tuple(args.prefill_contexts))
        profile = profile_executor(executor, rc.scheduler, grid, sizes)
        profile.to_csv(out / "profile.csv", index=False)
        stage_done("profile", t0, rows=len(profile), grid=dataclasses.asdict(grid))

        t0 = time.perf_counter()
        calibration = ["workload=bench", "workload.seed=1", f"workload.num_requests={args.calibration_requests}",
                       "workload.output_len.low=16", "workload.output_len.high=128"]
        outcome = run_once(run_config(base, calibration), False, executor=shared, record=True)
        write_outcome(outcome, out / "calibration", plots=False)
        stage_done("calibration_run", t0, overrides=calibration, steps=len(outcome.steps))
        real_steps = outcome.steps
        if not args.no_online_calibration:
            t0 = time.perf_counter()
            online = ["workload=trace_azure_conv", f"workload.start_row={args.online_calibration_start}",
                      f"workload.num_requests={args.azure_requests}", f"workload.rate_scale={args.azure_rate_scale}"]
            if args.trace_dir:
                online.append(f"workload.trace_dir={args.trace_dir}")
            online_outcome = run_once(run_config(base, online), False, executor=shared, record=True)
            write_outcome(online_outcome, out / "calibration_online", plots=False)
            real_steps = pd.concat([outcome.steps, online_outcome.steps], ignore_index=True)
            stage_done("calibration_online_run", t0, overrides=online, steps=len(online_outcome.steps))

        t0 = time.perf_counter()
        model, validation = validate(profile, real_steps, sizes)
        model.to_csv(out / "model.csv")
        validation.to_csv(out / "validation.csv", index=False)
        print(validation.to_string(index=False, float_format=lambda v: f"{v:.4f}"), flush=True)
        stage_done("fit", t0)

        cc = CompareConfig(profile_path=str(out / "model.csv"))
        bench_request_s = None
        for name in args.workloads:
            if not time_left():
                log.warning("deadline: skipping %s", name)
                continue
            if name == "bench":
                extra = ["workload=bench", f"workload.num_requests={args.bench_requests}"]
            elif name == "poisson":
                if bench_request_s is None:
                    log.warning("poisson needs the bench's throughput first: skipped")
                    continue
                extra = ["workload=poisson", f"workload.num_requests={args.poisson_requests}",
                         f"workload.rate={args.poisson_load * bench_request_s:.4f}"]
            else:
                extra = ["workload=trace_azure_conv", f"workload.num_requests={args.azure_requests}",
                         f"workload.rate_scale={args.azure_rate_scale}"]
                if args.trace_dir:
                    extra.append(f"workload.trace_dir={args.trace_dir}")
            t0 = time.perf_counter()
            result = compare(run_config(base, extra), cc, out / f"compare_{name}", executor=shared)
            if name == "bench":
                bench_request_s = float(result.table.set_index("metric").loc["request_s", "engine"])
            print(result.report, flush=True)
            stage_done(f"compare_{name}", t0, overrides=extra)
        if args.eager_bench and "bench" in args.workloads and time_left():
            from harness.profiling import graphs_bypassed

            t0 = time.perf_counter()
            extra = ["workload=bench", f"workload.num_requests={args.bench_requests}"]
            # the shared engine with its graphs set aside: it reports no graph sizes, so the
            # simulator prices decodes as eager too
            with graphs_bypassed(executor):
                result = compare(run_config(base, extra), cc, out / "compare_bench_eager", executor=shared)
            print(result.report, flush=True)
            stage_done("compare_bench_eager", t0, overrides=extra + ["(CUDA graphs bypassed)"])
    finally:
        executor.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
