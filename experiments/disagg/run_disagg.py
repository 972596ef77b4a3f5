"""Disaggregated prefill/decode on the engine against the simulator, in one device call.

    python3 -m experiments.disagg.run_disagg measure --model qwen3-0.6b --out $OUT   # 2 GPUs
    python3 -m experiments.disagg.run_disagg goodput --model qwen3-8b --out $OUT     # 2 GPUs
    python3 -m experiments.disagg.run_disagg goodput --model qwen3-8b --out /tmp/g --bundle $OUT/g.tar.gz
    python -m experiments.disagg.run_disagg plan --model qwen3-8b --out DIR          # no GPU
    python -m experiments.disagg.run_disagg measure --dry-run --model qwen3-8b --out DIR   # no GPU

measure: P prefill + D decode engine replicas (--pools, default 1P1D), then P + D aggregated
replicas, each against its simulation with the GPU's profiled cost model, on two workload
classes at each load x the fleet's measured capacity (experiments/disagg/cells.py); results as
each cell finishes: compare.md, compare.csv, runs.csv, transfers.csv, transfer_fit.csv; with
--keep-steps also every replica's steps, measured and simulated, per cell (steps_*.csv.gz, read by
experiments/disagg/step_report.py), and after the last cell every cell priced again at the host
speed its replicas' launches measured (compare_hosts.md beside compare.md:
experiments/disagg/measured_hosts.py). The simulated sends wait on the prefill GPU for its step in
flight, as the engine's BlockMover does (fleet.transfer.queue_behind_step, on here by default:
experiments/disagg/send_path_choice.md); --no-queue-behind-step: sent when posted, the pricing of the
calls committed before that default. The simulated side also prices the engine fleet's host work
where the GPU host has it measured (common.host_settings: backend.fleet_intake, backend.idle_start;
experiments/disagg/ttft_variants.md), recorded in settings.json; --no-host-settings: neither. On an
H100 or H200 it prices the decode kernel's waves less the profiling grid's own (common.kernel_settings,
experiments/disagg/decode_waves.md); --no-decode-waves: not.
goodput: the planner's pick on two scenarios, confirmed by the engine's goodput of both modes
(experiments/disagg/goodput.py): direction.md, goodput.csv, goodput_runs.csv, plan_<scenario>/.
plan: the planner alone, on the simulator (no GPU).
--dry-run: the same flow with the simulator in the engine's place (no GPU; the serving time a call
would take). --cpu runs any of them on the tiny model's CPU engines (gloo KV link, roofline
simulator): the tests' setting. Run from the repository root (-m, or PYTHONPATH=.).
Bad settings are refused in one line before any GPU work.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pandas as pd

from experiments.disagg import measured_hosts
from experiments.disagg.cells import Cells, MeasureConfig, write_settings
from experiments.disagg.common import (
    Deadline,
    Pools,
    Setup,
    detect_gpus,
    hardware_of,
    host_settings,
    kernel_settings,
    log,
    profile_for,
    trace_path,
)
from experiments.disagg.goodput import Ladder
from experiments.disagg.planning import plan
from experiments.disagg.workloads import CLASSES, CPU_SCENARIO_MODEL, SCENARIOS
from harness.compare.tables import markdown
from harness.convert import ConfigError
from harness.scripting import one_line_errors

COMMANDS = ("measure", "goodput", "plan")
# a goodput ladder's low rungs take long at the rate they test: fewer requests there
MIN_REQUESTS = {"measure": 100, "goodput": 60, "plan": 60}
# NVLink multicast off (the device note): NCCL's NVLS and torch's symmetric memory over it
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="results folder (default $OUT)")
    parser.add_argument("--model", default="qwen3-0.6b", help="conf/model name (measure: any dense model; "
                        f"goodput and plan: one of {sorted(SCENARIOS)})")
    parser.add_argument("--pools", default="1P1D", help="P prefill and D decode replicas, e.g. 1P3D (P + D GPUs)")
    parser.add_argument("--hardware", default=None, help="conf/hardware entry (default: from nvidia-smi; plan: h100)")
    parser.add_argument("--cpu", action="store_true", help="the tiny model on CPU (tests)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: the simulator stands in for the engine (same flow; prints the serving time)")
    parser.add_argument("--workloads", nargs="+", default=list(CLASSES), help=f"measure: of {list(CLASSES)}")
    parser.add_argument("--scenarios", nargs="+", default=None,
                        help="goodput and plan: some of the model's scenarios (default: all; workloads.py)")
    parser.add_argument("--loads", nargs="+", type=float, default=[0.5, 0.8], help="measure: fractions of capacity")
    parser.add_argument("--cell-s", type=float, default=20.0, help="a loaded run's arrivals span about this long")
    parser.add_argument("--min-requests", type=int, default=None,
                        help=f"a run's requests at least (default: measure {MIN_REQUESTS['measure']}, "
                             f"goodput {MIN_REQUESTS['goodput']})")
    parser.add_argument("--max-requests", type=int, default=800)
    parser.add_argument("--drain-requests", type=int, default=200, help="measure: an offline drain's requests at least")
    parser.add_argument("--drain-s", type=float, default=20.0,
                        help="measure: a drain gets what the simulator drains in this long (at most --max-drain)")
    parser.add_argument("--max-drain", type=int, default=1000)
    parser.add_argument("--warmup-requests", type=int, default=32)
    parser.add_argument("--trace", default=None, help="Azure conversation trace (default .traces/ or the shared one)")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], help="Hydra overrides for both sides")
    parser.add_argument("--sim-set", dest="sim_overrides", nargs="*", default=[],
                        help="Hydra overrides for the simulated side alone (e.g. backend.fleet_intake=true)")
    parser.add_argument("--host-settings", action=argparse.BooleanOptionalAction, default=True,
                        help="measure: the simulated side prices the engine fleet's host work where this GPU "
                        "host has it measured (backend.fleet_intake, backend.idle_start; common.host_settings); "
                        "--no-host-settings: neither")
    parser.add_argument("--decode-waves", action=argparse.BooleanOptionalAction, default=True,
                        help="measure: on an H100 or H200 the simulated side prices the decode kernel's waves less "
                        "the profiling grid's own (common.kernel_settings); --no-decode-waves: not")
    parser.add_argument("--limit-s", type=float, default=540.0, help="no run starts that would end past this")
    parser.add_argument("--session-s", type=float, default=60.0, help="least time left to start a fleet")
    parser.add_argument("--keep-steps", action="store_true",
                        help="measure: every run's per-replica steps and its simulation's (steps_*.csv.gz)")
    parser.add_argument("--queue-behind-step", action=argparse.BooleanOptionalAction, default=True,
                        help="the simulated side queues each send behind the prefill GPU's step in flight, as the "
                        "engine's BlockMover does (fleet.transfer.queue_behind_step; docs/disaggregation.md); "
                        "--no-queue-behind-step: the send leaves when posted, as the calls before this default")
    parser.add_argument("--receive-side", action=argparse.BooleanOptionalAction, default=True,
                        help="the simulated side prices the engine's receive side: the receive queued behind the "
                        "decode GPU's step in flight, the lags of the landing's check and of the send's message, "
                        "NCCL's measured rate (common.receive_side_link; transfer_parts.md); --no-receive-side: "
                        "as the calls before 2026-11-30")
    parser.add_argument("--bundle", type=Path, default=None,
                        help="a .tar.gz of --out, packed again as each part finishes (a device call returns one file)")
    args = parser.parse_args(argv)
    if args.out is None:
        parser.error("--out is required (or set OUT)")
    if args.min_requests is None:
        args.min_requests = MIN_REQUESTS[args.command]
    return args


def check(args: argparse.Namespace) -> Pools:
    """Every setting that can be refused before a GPU is touched, in one line each."""
    pools = Pools.parse(args.pools)
    bad = [w for w in args.workloads if w not in CLASSES]
    if bad or not args.workloads:
        raise ConfigError(f"--workloads must be some of {list(CLASSES)}, got {args.workloads}")
    if not args.loads or not all(0 < x <= 1.5 for x in args.loads):
        raise ConfigError(f"--loads must be fractions of capacity in (0, 1.5], got {args.loads}")
    for name in ("min_requests", "max_requests", "drain_requests", "max_drain", "warmup_requests"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.min_requests > args.max_requests:
        raise ConfigError(f"--min-requests {args.min_requests} exceeds --max-requests {args.max_requests}")
    if args.drain_requests > args.max_drain:
        raise ConfigError(f"--drain-requests {args.drain_requests} exceeds --max-drain {args.max_drain}")
    if min(args.cell_s, args.drain_s, args.limit_s) <= 0:
        raise ConfigError("--cell-s, --drain-s and --limit-s must be > 0 seconds")
    if args.bundle is not None:
        bundle, out = args.bundle.resolve(), args.out.resolve()
        if not bundle.name.endswith(".tar.gz") or bundle.parent == out or out in bundle.parents:
            raise ConfigError(f"--bundle must be a .tar.gz outside --out {args.out}, got {args.bundle}")
    if args.keep_steps and args.command != "measure":
        raise ConfigError(f"--keep-steps keeps the measure command's steps, not {args.command}'s")
    if args.command != "measure" and not args.cpu and args.model not in SCENARIOS:
        raise ConfigError(f"{args.command}: scenarios exist for {sorted(SCENARIOS)}, not {args.model!r}")
    names = [s.name for s in SCENARIOS[CPU_SCENARIO_MODEL if args.cpu else args.model]] \
        if args.command != "measure" else []
    if args.scenarios is not None and (not args.scenarios or not set(args.scenarios) <= set(names)):
        raise ConfigError(f"--scenarios must be some of {names}, got {args.scenarios}")
    return pools


def make_setup(args: argparse.Namespace, pools: Pools) -> Setup:
    measured = "sim" if args.dry_run else "engine"
    if args.cpu:
        return Setup("tiny-qwen3", "cpu", pools, cpu=True, measured=measured, overrides=tuple(args.overrides),
                     sim_overrides=tuple(args.sim_overrides), queue_behind_step=args.queue_behind_step,
                     receive_side=args.receive_side)
    if args.hardware is not None:
        hardware = args.hardware
    elif args.command == "plan" or args.dry_run:
        hardware = "h100"
    else:
        hardware = hardware_of(detect_gpus(), pools)
    profile, _ = profile_for(hardware, args.model, args.out)
    if args.command == "measure" and args.host_settings:  # settings.json records them with --sim-set's
        args.sim_overrides = [*host_settings(hardware), *args.sim_overrides]
    if args.command == "measure" and args.decode_waves:
        args.sim_overrides = [*kernel_settings(hardware), *args.sim_overrides]
    return Setup(args.model, hardware, pools, measured=measured, profile=profile, overrides=tuple(args.overrides),
                 sim_overrides=tuple(args.sim_overrides), queue_behind_step=args.queue_behind_step,
                 receive_side=args.receive_side)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)

    def run() -> int:
        pools = check(args)
        args.out = args.out.resolve()
        args.out.mkdir(parents=True, exist_ok=True)
        if args.bundle is not None:
            args.bundle = args.bundle.resolve()
            args.bundle.parent.mkdir(parents=True, exist_ok=True)
        deadline = Deadline(args.limit_s, None if args.bundle is None else (args.out, args.bundle))
        setup = make_setup(args, pools)
        trace = trace_path(args.trace) if args.command == "measure" and "conversation" in args.workloads else None
        write_settings(args.out, command=args.command, setup=setup, args=vars(args), trace=trace)
        for key, value in SAFE_ENV.items():
            os.environ.setdefault(key, value)  # the replica processes inherit it
        log(deadline, f"{args.command}: {setup.model} on {setup.hardware}, {pools.label} against {pools.gpus} "
                      f"aggregated; simulated with {setup.profile or 'the roofline model'}")
        if args.command == "measure":
            mc = MeasureConfig(tuple(args.workloads), tuple(args.loads), args.cell_s, args.min_requests,
                               args.max_requests, args.drain_requests, args.drain_s, args.max_drain,
                               args.warmup_requests, trace, args.session_s, args.keep_steps)
            Cells(setup, mc, args.out, deadline).run()
            at_hosts = price_at_hosts(args.out, trace, deadline) if args.keep_steps else ""
            deadline.pack()
            print((args.out / "compare.md").read_text())
            print(at_hosts, end="")
            if args.dry_run:
                serving_time(pd.read_csv(args.out / "runs.csv").query("side == 'measured'"), mc.warmup_requests)
            return 0
        scenarios = tuple(s for s in SCENARIOS[CPU_SCENARIO_MODEL if args.cpu else args.model]
                          if args.scenarios is None or s.name in args.scenarios)
        plans = pd.DataFrame([plan(setup, s, args.out / f"plan_{s.name}") for s in scenarios])
        plans.to_csv(args.out / "plan_direction.csv", index=False)
        deadline.pack()
        print(plans.to_string(index=False))
        if args.command == "plan":
            return 0
        table = Ladder(setup, scenarios, args.out, deadline, args.cell_s, args.min_requests, args.max_requests,
                       args.warmup_requests).run()
        write_direction(plans, table, args.out)
        deadline.pack()
        print((args.out / "direction.md").read_text())
        if args.dry_run:
            serving_time(pd.read_csv(args.out / "goodput_runs.csv"), args.warmup_requests)
        return 0

    return one_line_errors(run)


def price_at_hosts(out: Path, trace: str | None, deadline: Deadline) -> str:
    """compare_hosts.md: the cells priced again at each one's measured host (measured_hosts), where the
    call's time left fits it; else a line saying so."""
    if not deadline.fits(measured_hosts.ESTIMATE_S):
        text = "Not priced at the measured host: --limit-s left too little time\n"
        (out / measured_hosts.OUTPUT).write_text(text)
        return text
    log(deadline, f"pricing every cell at its measured host ({measured_hosts.OUTPUT})")
    return measured_hosts.priced_or_why(out, trace)


def serving_time(runs: pd.DataFrame, warmup_requests: int) -> None:
    """A dry run's estimate of a device call: the simulated serving time of its measured runs."""
    total = float(runs["makespan_s"].sum())
    print(f"dry run: {len(runs)} measured runs would serve for about {total:.0f} s (simulated), plus each fleet's "
          f"start (loading, CUDA graphs) and the warm-ups of {warmup_requests} requests")


def write_direction(plans: pd.DataFrame, goodput: pd.DataFrame, out: Path) -> None:
    """Per scenario: the planner's winner, each mode's goodput (simulated; measured as an interval),
    and the engine's winner: the mode whose measured goodput is at least the other's upper bound
    ("unresolved" where the intervals overlap), and what the runs settled (Ladder.settled)."""
    rows = []
    for p in plans.itertuples():
        mine = goodput[goodput["scenario"] == p.scenario].set_index("mode")
        bounds = {m: (mine.loc[m, "goodput_lo_req_s"], mine.loc[m, "goodput_hi_req_s"]) for m in mine.index}
        winner = next((a for a in bounds for b in bounds if a != b and bounds[a][0] >= bounds[b][1]), "unresolved")
        rows.append({"scenario": p.scenario, "planner_winner": p.winner,
                     **{f"sim_goodput_{m}": mine.loc[m, "sim_goodput_req_s"] for m in mine.index},
                     **{f"goodput_{m}": f"[{lo:.3g}, {hi:.3g})" for m, (lo, hi) in bounds.items()},
                     "engine_winner": winner, "confirmed": bool(winner == p.winner),
                     "settled": mine["settled"].iloc[0] if "settled" in mine else "unresolved"})
    table = pd.DataFrame(rows)
    table.to_csv(out / "direction.csv", index=False)
    (out / "direction.md").write_text(markdown(table) + "\n")

if __name__ == "__main__":
    sys.exit(main())
