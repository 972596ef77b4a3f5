"""Issue 36's two-GPU check: a data-parallel engine fleet whose second replica starts during the run,
served and simulated; TTFT P90 per window within 15% of the measured, and the moment the new replica
takes traffic within 10% of its measured start-up time.

One replica serves a rate it holds (--rates LOW) until --t0, then one it cannot (HIGH); at --t0 the
schedule policy (autoscale.schedule=[[0,1],[t0,2]]) launches the second replica's process on GPU 1,
which loads the checkpoint, captures its graphs and takes traffic once it says it is ready. The
simulator serves the same workload with the same schedule, the new replica's start-up being the
cold start this call measures with the fleet's settings (from the page cache: the first replica
has just read the checkpoint) beside a replica serving the HIGH rate, as the engine's second
replica starts (experiments/autoscale/loaded_probe.py), and the profiled cost model of the GPU and model.

Stages, each written as it ends (a timeout keeps what ran), under --out:
  cold_start/      the committed calibration's probe of --model at the default settings (--no-probe: none)
  midrun_probe/    the cold start at the fleet's settings (page cache); its calibration, with the start
                   beside a serving replica under "under_load", prices the simulated start
  midrun_probe_loaded/  that start beside a replica serving HIGH on GPU 0 (loaded_probe.py; --no-loaded: none)
  engine/, sim/    summary.csv, timeline.csv, lifetimes.csv, scaling.csv, autoscale.png of each side, and
                   requests.csv.gz and steps.csv.gz (per request; per step: when, how long, its batch)
  midrun_compare.csv, midrun_summary.csv, midrun.md, midrun_timeline.png
  cold_start/ again for each --probe-after model (qwen3-8b: its checkpoint is written first, 1-2 min)

  python -m experiments.autoscale.midrun_dp --out $OUT --probe-after qwen3-8b     # 2 GPUs
  python -m experiments.autoscale.midrun_dp --out /tmp/midrun --cpu               # CPU check, tiny model
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from experiments.autoscale import cold_start, loaded_probe, midrun_compare

CPU = {"model": "tiny-qwen3", "rates": "3,8", "t0": 2.0, "duration": 30.0, "window": 3.0, "interval": 1.0,
       "max_num_seqs": 4}
STEPS_KEPT = ("replica", "start", "duration", "kind", "requests", "prefill_tokens", "decode_tokens", "waiting",
              "running")
CPU_SETTINGS = ["scheduler.max_model_len=512", "cache.block_size=16", "workload.prompt_len.low=8",
                "workload.prompt_len.high=120", "workload.output_len.low=4", "workload.output_len.high=24"]


def fleet_overrides(args: argparse.Namespace, hardware: str) -> list[str]:
    """The workload, schedule and engine settings both sides share."""
    low, high = args.rates.split(",")
    return [f"model={args.model}", f"hardware={hardware}", "workload=poisson",
            f"workload.rate_profile=[[0,{low}],[{args.t0:g},{high}]]", f"workload.duration_s={args.duration:g}",
            f"scheduler.max_num_seqs={args.max_num_seqs}", f"router={args.router}", "fleet.replicas=1",
            "autoscale.policy=schedule", f"autoscale.schedule=[[0,1],[{args.t0:g},2]]", "autoscale.max_replicas=2",
            f"autoscale.interval_s={args.interval:g}", f"autoscale.report_window_s={args.window:g}",
            "autoscale.provision_s=0", "output.progress=false", "output.plots=false",
            *(CPU_SETTINGS if args.cpu else []), *args.set]


def compose(overrides: list[str]):
    from hydra.errors import HydraException

    from harness.convert import ConfigError
    from harness.scripting import compose_config

    try:
        cfg = compose_config(overrides)
        from harness.autoscale.config import build_autoscale
        from harness.config import build_run_config
        from harness.fleet.config import build_fleet

        return (build_run_config(cfg), *build_fleet(cfg), *build_autoscale(cfg))
    except (ConfigError, HydraException) as error:
        raise SystemExit(f"error: {str(error).splitlines()[0]}") from None


def serve(side: tuple, folder: Path, cold=None):
    """One side's autoscaled run; its compact tables and plot in folder."""
    from harness.autoscale.plots import plot_autoscale
    from harness.autoscale.run import events_frame, lifetimes_frame, run_autoscaled

    rc, fleet, router, autoscale, slo = side
    started = time.perf_counter()
    outcome = run_autoscaled(rc, fleet, router, autoscale, slo, progress=False, cold_start=cold)
    folder.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    pd.DataFrame([outcome.summary.to_row()]).to_csv(folder / "summary.csv", index=False)
    outcome.timeline.to_csv(folder / "timeline.csv", index=False)
    # per request and per step, to compare the two sides request by request (not committed: 2 MB)
    outcome.fleet.requests.to_csv(folder / "requests.csv.gz", index=False)
    outcome.fleet.steps[list(STEPS_KEPT)].to_csv(folder / "steps.csv.gz", index=False)
    lifetimes_frame(outcome.elastic).to_csv(folder / "lifetimes.csv", index=False)
    events_frame(outcome.elastic.events).to_csv(folder / "scaling.csv", index=False)
    plot_autoscale(outcome.timeline, outcome.summary, slo, folder / "autoscale.png")
    print(f"[midrun] {rc.backend}: {len(outcome.fleet.requests)} requests in {time.perf_counter() - started:.0f} s "
          f"-> {folder}", flush=True)
    return outcome


def compare(out: Path, title: str) -> dict:
    import pandas as pd

    windows = midrun_compare.compare_windows(pd.read_csv(out / "engine" / "timeline.csv"),
                                             pd.read_csv(out / "sim" / "timeline.csv"))
    ready = midrun_compare.ready_times(pd.read_csv(out / "engine" / "lifetimes.csv"),
                                       pd.read_csv(out / "sim" / "lifetimes.csv"))
    summary = midrun_compare.summarize(windows, ready)
    windows.to_csv(out / "midrun_compare.csv", index=False)
    pd.DataFrame([summary]).to_csv(out / "midrun_summary.csv", index=False)
    (out / "midrun.md").write_text(midrun_compare.markdown(summary, windows, title))
    midrun_compare.plot(windows, ready, title, out / "midrun_timeline.png")
    return summary


def probe_loaded(args: argparse.Namespace, ckpt: Path, hardware: str, settings: list[str], base: list[str],
                 alone_s: float) -> dict:
    """The start beside a replica serving the HIGH rate (experiments/autoscale/loaded_probe.py): the
    neighbour's own start (alone_s) and 10 s pass first; it serves long enough for both starts."""
    high = float(args.rates.split(",")[1])
    wait = alone_s + 10.0
    neighbour = loaded_probe.neighbour_overrides(args.model, ckpt, hardware, high, 4 * alone_s + 30.0,
                                                 args.max_num_seqs, [*base, *args.set])
    return loaded_probe.probe_under_load(args.model, ckpt, hardware, args.out / "midrun_probe_loaded", 2, settings,
                                         neighbour, wait, args.cpu)


def check(args: argparse.Namespace) -> None:
    rates = args.rates.split(",")
    if len(rates) != 2 or not all(r.replace(".", "", 1).isdigit() and float(r) > 0 for r in rates):
        raise SystemExit(f"error: --rates must be LOW,HIGH req/s, both > 0, got {args.rates!r}")
    if not 0 < args.t0 < args.duration:
        raise SystemExit(f"error: --t0 {args.t0:g} must be within the run (0, --duration {args.duration:g})")
    if abs(args.t0 / args.interval - round(args.t0 / args.interval)) > 1e-9:
        raise SystemExit(f"error: --t0 {args.t0:g} must be a multiple of --interval {args.interval:g} (the policy "
                         "acts at its evaluations)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cpu", action="store_true", help="two CPU replicas of the tiny model (a check, no targets)")
    p.add_argument("--model", default=None, help="conf/model name (default qwen3-0.6b; --cpu: tiny-qwen3)")
    p.add_argument("--ckpt-root", type=Path, default=Path("/tmp/ck"), help="checkpoints are written to ROOT/<model>")
    p.add_argument("--rates", default=None, help="LOW,HIGH req/s before and after t0 (default 10,45)")
    p.add_argument("--t0", type=float, default=None, help="when the rate steps up and replica 2 starts (30 s)")
    p.add_argument("--duration", type=float, default=None, help="arrivals stop here (120 s)")
    p.add_argument("--window", type=float, default=None, help="timeline window (10 s)")
    p.add_argument("--interval", type=float, default=None, help="policy evaluations (5 s)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="scheduler.max_num_seqs (64: HIGH queues on one)")
    p.add_argument("--router", default="least_requests")
    p.add_argument("--repeats", type=int, default=2, help="cold-start probe: starts from disk")
    p.add_argument("--no-probe", dest="probe", action="store_false", help="skip the default-settings probe")
    p.add_argument("--no-loaded", dest="loaded", action="store_false", help="skip the probe beside a serving "
                   "replica (the simulated start is then priced by the probe alone)")
    p.add_argument("--probe-after", default="", help="models probed after the fleet, e.g. qwen3-8b")
    p.add_argument("--set", action="append", default=[], help="another harness override for both sides")
    p.add_argument("--sim-set", action="append", default=[],
                   help="a harness override for the simulated side alone (e.g. backend.profile_path=...)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    defaults = CPU if args.cpu else {"model": "qwen3-0.6b", "rates": "10,45", "t0": 30.0, "duration": 120.0,
                                     "window": 10.0, "interval": 5.0, "max_num_seqs": 64}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    check(args)
    hardware = "cpu" if args.cpu else cold_start.gpu_hardware(min_gpus=2)
    ckpt = args.ckpt_root / args.model
    shared = fleet_overrides(args, hardware)
    device = ["backend.device=cpu"] if args.cpu else []
    engine_side = compose(shared + ["backend=engine", f"backend.model={ckpt}", *device])
    sim = ["backend=sim"] + ([] if args.cpu else ["backend.cost_model=profiled"])
    sim_side = compose(shared + sim + args.sim_set)
    args.out.mkdir(parents=True, exist_ok=True)
    base = [*CPU_SETTINGS, *device] if args.cpu else []
    cold_start.ensure_checkpoint(args.model, ckpt)
    if args.probe:
        cold_start.probe(args.model, ckpt, hardware, args.out / "cold_start", args.repeats, 1, True, base,
                         f"python -m experiments.autoscale.midrun_dp {' '.join(argv or sys.argv[1:])}")
    fleet_settings = [f"scheduler.max_num_seqs={args.max_num_seqs}", *base, *args.set]
    measured = cold_start.probe(args.model, ckpt, hardware, args.out / "midrun_probe", 0, 2, False, fleet_settings,
                                "midrun_dp, the fleet's settings")
    alone_path = args.out / "midrun_probe" / "profiles" / hardware / f"{args.model}.cold_start.json"
    if args.loaded:
        loaded = probe_loaded(args, ckpt, hardware, fleet_settings, base, measured["startup_s"])
        loaded_probe.merged(alone_path, loaded)
        print(f"[midrun] start-up beside a serving replica {loaded['startup_s']:.1f} s (alone "
              f"{measured['startup_s']:.1f} s)", flush=True)
    serve(engine_side, args.out / "engine")
    from harness.autoscale.calibration import read_calibration

    rc = sim_side[0]
    calibration = read_calibration(alone_path)  # its under_load, where measured, prices the start
    cold = calibration.cold_start(0.0, rc.model.weight_bytes_per_rank(1), rc.sim.execution.enforce_eager, cached=True)
    print(f"[midrun] simulated start-up {cold.total_s:.1f} s (measured ready {measured['startup_s']:.1f} s)",
          flush=True)
    serve(sim_side, args.out / "sim", cold)
    title = (f"Replica 2 started at {args.t0:g} s: {args.model} on 2 x {hardware}, rate {args.rates} req/s, "
             "engine vs simulated")
    summary = compare(args.out, title)
    print(f"[midrun] TTFT P90 within 15% in {summary['windows_within_15pct']} of {summary['windows_scored']} windows;"
          f" replica 2 ready at {summary['ready_s_engine']:.1f} s measured, {summary['ready_s_sim']:.1f} s simulated "
          f"({100 * summary['ready_error_of_startup']:+.1f}% of its {summary['startup_s_engine']:.1f} s start-up)",
          flush=True)
    for model in filter(None, args.probe_after.split(",")):
        cold_start.ensure_checkpoint(model, args.ckpt_root / model)
        cold_start.probe(model, args.ckpt_root / model, hardware, args.out / "cold_start", args.repeats, 1, True,
                         base, f"python -m experiments.autoscale.midrun_dp --probe-after {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
