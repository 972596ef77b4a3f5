"""Simulate the cells of a held-out table again with another profiled model, on the CPU: each
class at the rate the device call served it (offline cells offline), with the engine's block
count and its default CUDA graphs, against the engine values the table already holds. For a cost
model that changed after a device call (a new transfer rule), or one the call did not run.

    python experiments/fidelity/resimulate.py experiments/fidelity/h200/heldout_calls.csv \
        experiments/fidelity/h200/qwen3-0.6b_from_h100.csv --label carried --model qwen3-0.6b \
        --hardware h200 --num-blocks 4418 --out /tmp/carried.csv

--check-label profiled prints the largest relative difference of the new point predictions from
that cost model's in the table (the same model file must be given): 0 when this script rebuilds
the cells exactly as the call did (and of the interval's bounds, where both have them). --interval
adds the prediction interval (sim.interval, the default IntervalConfig) as the fidelity run does for
its profiled rows; --workloads keeps some classes (a call's NUM_REQUESTS may differ between classes).
--cost-model roofline prices the cells with the roofline of --hardware instead (no profile): for a
call whose roofline priced another GPU than the one it ran on. --host-scale (one factor) or
--host-scales (a CSV of workload, load, host_scale[, host_jitter]; a row per engine repeat: the
cell is simulated at each and its predictions averaged; --host-jitter uses the jitter column too)
price the profiled model's host parts for the serving machine's host (sim.host_speed): 1, the
default, prices them as the profile measured them. --device-scale prices the loaded cells' device
work that many times the profile's (sim.device_speed; experiments/fidelity/cause/host_scales.py reads
one off a class's drain, its device_scale column); offline cells keep the profile's.

    python experiments/fidelity/resimulate.py <table> --cost-model roofline --label roofline \
        --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1000 --out /tmp/roofline.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from harness.compare.study import sim_run_config
from harness.convert import ConfigError
from harness.fidelity import classes
from harness.fidelity.interval import simulate_with_interval
from harness.fidelity.report import HOST_COLUMNS, holds, rel_error
from harness.run import run_once
from harness.scripting import compose_run_config, one_line_errors
from sim.decode_programs import DECODE_PROGRAMS_BASELINES
from sim.interval import IntervalConfig
from sim.repeated_reads import RULES

MAX_MODEL_LEN = 16384  # run_gpu.sh's
IDLE_START = {"on": True, "off": False, "auto": None}  # --idle-start: SimConfig.idle_start


def cell_config(base, workload: str, load: str, rate: float, num_requests: int, preempt_num_blocks: int | None):
    rc = classes.class_run_config(base, workload, num_requests, 1.0, preempt_num_blocks)
    return rc if load == "offline" else classes.with_rate(rc, workload, rate)


def resimulate(table: pd.DataFrame, profile: Path | None, label: str, overrides: list[str], num_blocks: int,
               num_requests: int, preempt_num_blocks: int | None, interval: bool = False,
               cost_model: str = "profiled", host_scale: float = 1.0,
               host_scales: dict[tuple[str, str], list[tuple[float, float]]] | None = None,
               moe_routing_skew: float = 0.0, moe_routing_locality: float = 0.0,
               moe_routing_shared_prefix: bool = False, moe_routing_shared_fresh: float | None = None,
               moe_routing_shared_cap: int | None = None, repeated_reads: str = "additive",
               decode_programs_baseline: str = "none", idle_start: bool | None = False,
               interval_config: IntervalConfig | None = None, plan_after_launches: bool = False,
               device_scale: float = 1.0, power_curve: str | None = None) -> pd.DataFrame:
    """host_scales: each cell's hosts, (scale, jitter) per engine repeat (sim.host_speed): the cell
    is simulated once per host and its predictions averaged, as its engine value averages the
    repeats; cells without an entry take host_scale and no jitter. repeated_reads,
    decode_programs_baseline, idle_start, plan_after_launches: SimConfig's. device_scale: the serving GPU's
    (SimConfig's), for the loaded cells; offline cells, whose drain measured it, keep 1. power_curve:
    SimConfig's (sim.power_limit), for every cell. interval_config:
    the interval's, where interval is set (default: IntervalConfig())."""
    interval_config = interval_config or IntervalConfig()
    base = compose_run_config(overrides + [f"scheduler.max_model_len={MAX_MODEL_LEN}"])
    table = table[(table["model"] == base.model.name) & (table["hardware"] == base.hardware.name)]
    if table.empty:
        raise ConfigError(f"the table has no cells of {base.model.name} on {base.hardware.name}")
    reference = table[table["cost_model"] == table["cost_model"].iloc[0]]
    rows = []
    cells = list(reference.groupby(["workload", "load"], sort=False))
    for (workload, load), part in tqdm(cells, desc=f"resimulate {label}", unit="cell"):
        rc = cell_config(base, workload, str(load), float(part["rate_req_s"].iloc[0]), num_requests, preempt_num_blocks)
        blocks = rc.cache.num_blocks if workload == "preempting_bench" else num_blocks
        meta = {"num_blocks": blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True,
                "moe_routing_skew": moe_routing_skew, "moe_routing_locality": moe_routing_locality,
                "moe_routing_shared_prefix": moe_routing_shared_prefix,
                "moe_routing_shared_fresh": moe_routing_shared_fresh, "moe_routing_shared_cap": moe_routing_shared_cap}
        sim_rc = sim_run_config(rc, cost_model, None if profile is None else str(profile), meta)
        summaries, hosts = [], (host_scales or {}).get((str(workload), str(load)), [(host_scale, 0.0)])
        device = 1.0 if str(load) == "offline" else device_scale
        for scale, jitter in hosts:
            scaled = dataclasses.replace(sim_rc, sim=dataclasses.replace(sim_rc.sim, execution=base.sim.execution,
                                                                         host_scale=scale, host_jitter=jitter,
                                                                         device_scale=device, power_curve=power_curve,
                                                                         repeated_reads=repeated_reads,
                                                                         decode_programs_baseline=decode_programs_baseline,
                                                                         idle_start=idle_start,
                                                                         plan_after_launches=plan_after_launches))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if interval:
                    summaries.append(simulate_with_interval(scaled, interval_config).summary)
                else:
                    summaries.append(run_once(scaled, False, label=f"sim {label}").summary)

        def mean(key: str) -> float:
            return float(np.mean([float(s.get(key, np.nan)) for s in summaries]))

        # the host the cell was priced at, where not the profile's (harness.fidelity.report.at_measured_host)
        host = {"host_scale": float(np.mean([scale for scale, _ in hosts]))} if host_scales or host_scale != 1 else {}
        if device_scale != 1.0:
            host["device_scale"] = device
        if power_curve is not None:
            host["power_curve"] = Path(power_curve).name

        for _, row in part.iterrows():
            metric, engine = row["metric"], row["engine"]
            sim = mean(metric)
            lo, hi = mean(f"{metric}_lo"), mean(f"{metric}_hi")
            inside = holds(lo, hi, engine)
            given = {k: v for k, v in row.to_dict().items() if k not in HOST_COLUMNS}  # the table's host, not ours
            rows.append({**given, "sim": sim, "err": rel_error(sim, engine), "cost_model": label,
                         "sim_lo": lo, "sim_hi": hi, "in_interval": inside, **host})
    return pd.DataFrame(rows)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="a device call's heldout.csv")
    parser.add_argument("profile", type=Path, nargs="?", default=None,
                        help="the profiled model (model.csv) to simulate with (not for --cost-model roofline)")
    parser.add_argument("--cost-model", choices=("profiled", "roofline"), default="profiled")
    parser.add_argument("--label", required=True, help="the cost_model name of the new rows")
    parser.add_argument("--model", required=True, help="conf/model name")
    parser.add_argument("--hardware", required=True, help="conf/hardware name the call ran on")
    parser.add_argument("--num-blocks", type=int, required=True, help="the engine's KV blocks (the call's log)")
    parser.add_argument("--num-requests", type=int, required=True, help="the call's NUM_REQUESTS")
    parser.add_argument("--preempt-num-blocks", type=int, default=None,
                        help="the preempting bench's pool as the call pinned it (default: sized as the protocol "
                             "sizes it; 400 for calls before it was)")
    parser.add_argument("--moe-routing-skew", type=float, default=0.0,
                        help="a mixture-of-experts model's routing skew as the call measured or set it (its log)")
    parser.add_argument("--moe-routing-locality", type=float, default=0.0,
                        help="how alike one sequence's tokens route (sim.moe_locality; 0: independently), as "
                             "the call fitted it (its log) or experiments/fidelity/fit_locality.py does")
    parser.add_argument("--moe-routing-shared-prefix", action="store_true",
                        help="price sequences that start with the same tokens as routing groups (sim.features."
                             "routing_sequences), as the call decided it (its log)")
    parser.add_argument("--moe-routing-shared-fresh", type=float, default=None,
                        help="with --moe-routing-shared-prefix: how alike a group's members route "
                             "(sim.moe_shared_prefix), as the call fitted it (its log); none: a group as one sequence")
    parser.add_argument("--moe-routing-shared-cap", type=int, default=None,
                        help="with --moe-routing-shared-fresh: the routings a group's later members choose among")
    parser.add_argument("--check-label", default=None, help="a cost model the call simulated with this profile")
    parser.add_argument("--interval", action="store_true", help="add the prediction interval")
    parser.add_argument("--workloads", default=None, help="comma-separated classes to keep (default: all)")
    parser.add_argument("--host-scale", type=float, default=1.0,
                        help="the serving host's speed against the profile's (sim.host_speed; default 1)")
    parser.add_argument("--host-scales", type=Path, default=None,
                        help="a CSV of workload, load, host_scale[, host_jitter]: each cell's, a row per engine "
                             "repeat (experiments/fidelity/cause/host_scales.py); cells it lacks take --host-scale")
    parser.add_argument("--device-scale", type=float, default=1.0,
                        help="the serving GPU's step time against the profile's GPU, for the loaded cells "
                             "(sim.device_speed; the drain's, host_scales.py's device_scale; default 1)")
    parser.add_argument("--power-curve", default=None,
                        help="a GPU at its power limit: steps slow with the recent prefill rate as this curve "
                             "measured (backend.power_curve, sim.power_limit; default: none)")
    parser.add_argument("--host-jitter", action="store_true",
                        help="with --host-scales: each host's step-to-step jitter too (its host_jitter column)")
    parser.add_argument("--repeated-reads", choices=RULES, default="additive",
                        help="how a shared prefix's KV read again is priced (backend.repeated_reads; default additive)")
    parser.add_argument("--decode-programs-baseline", choices=DECODE_PROGRAMS_BASELINES, default="none",
                        help="what a decode step's wait on its longest programs is counted from "
                             "(backend.decode_programs_baseline; default none)")
    parser.add_argument("--decode-programs-per-sm", type=int, default=None,
                        help="the kernel's programs an SM holds (hardware.decode_programs_per_sm: its waves; "
                             "default: the hardware entry's)")
    parser.add_argument("--idle-start", nargs="?", const="on", default="off", choices=tuple(IDLE_START),
                        help="a step onto an idle device first waits the host's idle_start_host_s "
                             "(backend.idle_start): on (the bare flag), off (the default) or auto (where measured, "
                             "for a profile without lead fits: the held-out protocol's fidelity.idle_start)")
    parser.add_argument("--plan-after-launches", action="store_true",
                        help="plan each step once the prefill in flight's priced launches are done, not at the "
                             "previous step's end (backend.plan_after_launches)")
    parser.add_argument("--interval-seed", type=int, default=IntervalConfig.seed,
                        help="with --interval: the seed of its draws (the protocol's: 0)")
    parser.add_argument("--machine-spread", type=float, default=None,
                        help="with --interval: the machine factor's half-width (default: the model's, sim.interval)")
    parser.add_argument("--prefill-graph-tokens", type=int, default=None,
                        help="the engine's prefill graphs' largest size as the call set it "
                             "(execution.prefill_graph_tokens; default: the config's)")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def host_scales(path: Path, jitter: bool = False) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """A --host-scales CSV: per (workload, load), each engine repeat's (host_scale, host_jitter);
    jitter 0 unless asked for (its host_jitter column)."""
    given = pd.read_csv(path)
    if jitter and "host_jitter" not in given:
        raise ConfigError(f"--host-jitter: {path} has no host_jitter column")
    jitters = given["host_jitter"] if jitter else [0.0] * len(given)
    scales: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for w, ld, h, j in zip(given["workload"], given["load"], given["host_scale"], jitters):
        scales.setdefault((str(w), str(ld)), []).append((float(h), float(j)))
    return scales


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def run() -> int:
        if (args.profile is None) != (args.cost_model == "roofline"):
            raise ConfigError("profile: give a model.csv for --cost-model profiled, none for roofline")
        try:
            interval_config = IntervalConfig(seed=args.interval_seed, machine_spread=args.machine_spread)
        except ValueError as error:
            raise ConfigError(str(error).replace("interval.seed", "--interval-seed")
                              .replace("interval.machine_spread", "--machine-spread")) from None
        table = pd.read_csv(args.table)
        if args.workloads:
            table = table[table["workload"].isin(args.workloads.split(","))]
        overrides = [f"model={args.model}", f"hardware={args.hardware}", "backend=sim"]
        if args.decode_programs_per_sm is not None:
            overrides.append(f"hardware.decode_programs_per_sm={args.decode_programs_per_sm}")
        if args.prefill_graph_tokens is not None:
            overrides.append(f"execution.prefill_graph_tokens={args.prefill_graph_tokens}")
        scales = None if args.host_scales is None else host_scales(args.host_scales, args.host_jitter)
        new = resimulate(table, args.profile, args.label, overrides, args.num_blocks, args.num_requests,
                         args.preempt_num_blocks, args.interval, args.cost_model, args.host_scale, scales,
                         args.moe_routing_skew, args.moe_routing_locality, args.moe_routing_shared_prefix,
                         args.moe_routing_shared_fresh, args.moe_routing_shared_cap, args.repeated_reads,
                         args.decode_programs_baseline, IDLE_START[args.idle_start], interval_config,
                         args.plan_after_launches, args.device_scale, args.power_curve)
        if args.check_label:
            keys = ["model", "hardware", "workload", "load", "metric"]
            old = table[table["cost_model"] == args.check_label].set_index(keys)
            for column in ("sim", "sim_lo", "sim_hi"):
                diff = (new.set_index(keys)[column] - old[column]) / old[column]
                if diff.notna().any():
                    largest = np.nanmax(np.abs(diff))
                    print(f"largest relative difference of {column} from the call's {args.check_label} cells: "
                          f"{largest:.2e}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        new.to_csv(args.out, index=False)
        print(new.pivot_table(index=["workload", "load"], columns="metric", values="err").round(3).to_string())
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
