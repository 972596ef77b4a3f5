"""A disaggregated fleet whose pools scale on their own (fleet=disaggregated with fleet.prefill.autoscale
and/or fleet.decode.autoscale), simulated: engine.core.disagg_elastic.

Each pool's settings are the autoscale section's with the pool's own over them (policy, bounds,
thresholds, cooldowns, its cold start priced from its model and hardware); a pool without any keeps
its size. Outputs: the disaggregated fleet's tables (harness.fleet.disagg.tabulate), summary.csv with
the autoscaled run's columns (gpu_hours and cost over both pools, scale_ups, scale_downs, SLO
attainment) and each pool's mean replicas and cold start, lifetimes.csv and scaling.csv with a pool
column, timeline.csv with each pool's replicas by state and KV use, autoscale.png (the pools summed).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from engine.core import make_scheduler
from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_elastic import POOLS, ElasticDisaggResult, run_disaggregated_elastic
from engine.core.elastic_limits import ReplicaLimits
from engine.core.elastic_states import Scaling
from engine.core.loop import SimulatedClock
from engine.core.routers import RouterConfig, make_router
from harness.autoscale.capacity import replica_limits
from harness.autoscale.config import (
    SLO,
    AutoscaleConfig,
    check_evaluations,
    check_report_windows,
    last_arrival,
    slo_needed,
)
from harness.autoscale.policies import make_policy
from harness.autoscale.run import cold_start_of, events_frame, lifetimes_frame
from harness.autoscale.timeline import STATES, attains, gpu_hours, peak_replicas, timeline
from harness.config import OutputConfig, RunConfig
from harness.convert import ConfigError, to_dataclass
from harness.fleet.config import backend_tp_size
from harness.fleet.disagg import _check_decode_cache, pool_executor, tabulate
from harness.fleet.disagg_config import DisaggConfig, pool_run_configs, pool_staging_blocks
from harness.fleet.intake import fleet_intake
from harness.labels import run_identity
from harness.output.summary import FitCounts, FleetLabels, RunLabels
from harness.run import cyclic_gc_paused, require_served, write_tables
from harness.run_folder import staged
from harness.workloads import build_workload


def pool_autoscale(fleet: DisaggConfig, base: AutoscaleConfig, slo: SLO) -> tuple[AutoscaleConfig, AutoscaleConfig]:
    """Each pool's settings: base with the pool's autoscale over it (none: its size held)."""
    configs = []
    for pool in POOLS:
        overrides = getattr(fleet, pool).autoscale or {}
        if "report_window_s" in overrides:
            raise ConfigError(f"fleet.{pool}.autoscale.report_window_s: timeline.csv's windows are the fleet's: "
                              "set autoscale.report_window_s")
        start = getattr(fleet, f"{pool}_replicas")
        held = {} if overrides else {"min_replicas": start, "max_replicas": start}
        merged = {**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)}, **held, **overrides}
        config = to_dataclass(AutoscaleConfig, merged, f"fleet.{pool}.autoscale")
        if config.policy is not None:
            config.check_read(f"fleet.{pool}.autoscale", (config.policy,))
        slo_needed(config, slo, f"fleet.{pool}.autoscale")
        if not config.min_replicas <= start <= config.max_replicas:
            raise ConfigError(f"fleet.{pool}_replicas={start} (the starting count) must be within fleet.{pool}."
                              f"autoscale's min_replicas={config.min_replicas} and max_replicas={config.max_replicas}")
        configs.append(config)
    return configs[0], configs[1]


def _refuse_unsupported(rc: RunConfig, fleet: DisaggConfig) -> None:
    """Autoscaled pools exist in the simulator only, and without the transfer handshake or the receive's queue."""
    if rc.backend != "sim":
        raise ConfigError(f"fleet.prefill.autoscale / fleet.decode.autoscale: pools scale on their own in the "
                          f"simulator only (backend=sim), got backend={rc.backend}")
    if fleet.transfer.handshake:
        raise ConfigError("fleet.transfer.handshake=true is not modelled with autoscaled pools "
                          "(fleet.prefill.autoscale / fleet.decode.autoscale): set it false")
    if fleet.transfer.recv_behind_step:
        raise ConfigError("fleet.transfer.recv_behind_step=true is not modelled with autoscaled pools "
                          "(fleet.prefill.autoscale / fleet.decode.autoscale): set it false")


def run_disagg_autoscaled(rc: RunConfig, fleet: DisaggConfig, router: RouterConfig,
                          autoscales: tuple[AutoscaleConfig, AutoscaleConfig], slo: SLO, progress: bool = True):
    """Serve rc.workload on the disaggregated fleet, each pool scaled by its own settings."""
    from sim.kv_transfer import KVTransferPricer

    _refuse_unsupported(rc, fleet)
    pools = pool_run_configs(rc, dataclasses.replace(fleet, prefill_replicas=autoscales[0].max_replicas,
                                                     decode_replicas=autoscales[1].max_replicas))
    tps = [backend_tp_size(p) for p in pools]
    colds = [cold_start_of(p, a, tp, f"fleet.{pool}.autoscale")
             for p, a, tp, pool in zip(pools, autoscales, tps, POOLS)]
    # a replica's memory plan is made once, at its start: its staging is for every peer the other pool may have
    staging = pool_staging_blocks(pools, (autoscales[0].max_replicas, autoscales[1].max_replicas))
    probes = [pool_executor(p, s, name) for p, s, name in zip(pools, staging, POOLS)]
    infos = [e.info() for e in probes]
    workload = build_workload(rc.workload, rc.scheduler.max_model_len, infos[0].vocab_size)
    span = last_arrival(workload.requests)
    for pool, config in zip(POOLS, autoscales):
        if config.policy is not None:
            check_evaluations(config.interval_s, span, f"fleet.{pool}.autoscale")
    check_report_windows(autoscales[0].report_window_s, span, "autoscale")  # the same in both: pool_autoscale
    _check_decode_cache(workload.requests, infos[1].num_blocks, infos[1].block_size, rc.scheduler.max_model_len)

    intake = fleet_intake(pools[0])  # requests reach the prefill replicas' processes

    def maker(p: int, kind: type):
        def make(index: int):
            executor = probes[p] if index == 0 else pool_executor(pools[p], staging[p], POOLS[p])
            replica = kind(index, make_scheduler(pools[p].scheduler, infos[p], pools[p].cache), executor,
                           SimulatedClock())
            if p == 0:
                replica.intake = intake
            return replica
        return make

    routers = [make_router(RouterConfig(name or router.name, router.prefix_blocks, router.max_imbalance),
                           rc.cache.block_size) for name in (fleet.prefill_router, fleet.decode_router)]
    pricer = KVTransferPricer(fleet.transfer, rc.model.with_kv_cache(rc.cache.kv_cache_dtype), pools[0].hardware,
                              pools[1].hardware, tps[0], tps[1])
    bar = tqdm(total=len(workload.requests), desc=f"autoscaled P/D x {rc.workload.label}", unit="req",
               disable=not progress, mininterval=0.5, leave=False, dynamic_ncols=True)
    started = time.perf_counter()
    with bar, cyclic_gc_paused():
        result = run_disaggregated_elastic(
            (maker(0, PrefillReplica), maker(1, DecodeReplica)), (fleet.prefill_replicas, fleet.decode_replicas),
            workload.requests, routers[0], routers[1], pricer, _scalings(pools, infos, autoscales, colds),
            (make_policy(autoscales[0], slo), make_policy(autoscales[1], slo)),
            (lambda i, record, finished: bar.update(len(finished))) if progress else None,
            fleet.transfer.sends_queue_behind_step())
    counts = (len(result.prefill.lifetimes), len(result.decode.lifetimes))
    gpus = sum(peak_replicas(h.lifetimes) * tp for h, tp in zip((result.prefill, result.decode), tps))
    shape = FleetLabels(router=f"{fleet.prefill_router or router.name} / {fleet.decode_router or router.name}",
                        replicas=sum(counts), tp_sizes=f"{tps[0]}P {tps[1]}D", gpus=gpus)
    labels = RunLabels(backend=rc.backend, **{**run_identity(rc), "hardware": f"{pools[0].hardware.name} / "
                                                                              f"{pools[1].hardware.name}"},
                       num_submitted=len(workload.requests), num_rejected=len(result.fleet.rejected),
                       fit=FitCounts(**workload.fit_counts()), wall_s=time.perf_counter() - started, fleet=shape)
    blocks = {"prefill": [infos[0].num_blocks] * counts[0], "decode": [infos[1].num_blocks] * counts[1]}
    outcome = tabulate(result.fleet, blocks, labels, counts)
    frame = _timeline(outcome, result, [i.num_blocks for i in infos], autoscales, slo)
    outcome.summary = outcome.summary.with_extras(_extras(outcome.requests, result, autoscales, slo, colds, tps, rc))
    return outcome, result, frame


def _scalings(pools: list[RunConfig], infos, autoscales, colds) -> tuple[Scaling, Scaling]:
    """Each pool's scaling, with its replicas' limits for the policies' sizing on the demand: the prefill
    pool's token rate priced by its step model (harness.autoscale.capacity); the decode pool's
    sequence slots and KV (its steps compute one token a request, so its token budget does not bind)."""
    from sim import build_sim_executor

    prefill, decode = pools
    pricing = build_sim_executor(prefill.model, prefill.hardware, prefill.sim, prefill.cache, prefill.scheduler)
    limits = (replica_limits(pricing.cost_model.step_time, prefill.scheduler, infos[0].num_blocks,
                             infos[0].block_size),
              ReplicaLimits(decode.scheduler.max_num_seqs, infos[1].num_blocks * infos[1].block_size))
    return (dataclasses.replace(autoscales[0].scaling(colds[0]), limits=limits[0]),
            dataclasses.replace(autoscales[1].scaling(colds[1]), limits=limits[1]))


def _timeline(outcome, result: ElasticDisaggResult, blocks: list[int], autoscales, slo: SLO) -> pd.DataFrame:
    """The aggregated timeline's columns, with replicas by state and KV use per pool (prefixed) and summed."""
    window, end = autoscales[0].report_window_s, result.fleet.makespan_s
    check_report_windows(window, end, "autoscale")
    frames = [timeline(outcome.requests, outcome.steps[outcome.steps["pool"] == pool], history.lifetimes, n, window,
                       end, slo) for pool, history, n in zip(POOLS, (result.prefill, result.decode), blocks)]
    frame = frames[0].drop(columns=[*STATES, "kv_used"])
    for pool, part in zip(POOLS, frames):
        for column in (*STATES, "kv_used"):
            frame[f"{pool}_{column}"] = part[column].to_numpy()
    for state in STATES:
        frame[state] = frames[0][state].to_numpy() + frames[1][state].to_numpy()
    frame["kv_used"] = frames[1]["kv_used"].to_numpy()  # the decode pool's: where the KV stays
    return frame


def _extras(requests: pd.DataFrame, result: ElasticDisaggResult, autoscales, slo: SLO, colds, tps, rc) -> dict:
    histories = (result.prefill, result.decode)
    end = result.fleet.makespan_s
    hours = [gpu_hours(h.lifetimes, tp) for h, tp in zip(histories, tps)]
    price = rc.hardware.price_per_gpu_hour
    attainment = float(attains(requests, slo).mean()) if slo.is_set and len(requests) else math.nan
    extras = {"autoscale_policy": " / ".join(f"{pool}: {a.policy or 'static'}" for pool, a in zip(POOLS, autoscales)),
              "gpu_hours": sum(hours), "cost": sum(hours) * price if price is not None else math.nan,
              "scale_ups": sum(e.direction == "up" for h in histories for e in h.events),
              "scale_downs": sum(e.direction == "down" for h in histories for e in h.events),
              "slo_attainment": attainment,
              "slo_met": bool(attainment >= slo.target_attainment) if slo.is_set else None}
    for pool, h, tp, cold in zip(POOLS, hours, tps, colds):
        extras[f"mean_{pool}_replicas"] = h * 3600.0 / (tp * end) if end > 0 else math.nan
        extras[f"{pool}_cold_start_s"] = cold.total_s
    return extras


def run_disagg_autoscale_study(rc: RunConfig, fleet: DisaggConfig, router: RouterConfig, autoscale: AutoscaleConfig,
                               slo: SLO, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    """`python -m harness fleet=disaggregated fleet.decode.autoscale=...`: one run, its tables and plot."""
    from harness.report import format_summary

    outcome, result, frame = run_disagg_autoscaled(rc, fleet, router, pool_autoscale(fleet, autoscale, slo), slo,
                                                   output.progress)
    with staged(out_dir) as staging:  # summary.csv appears last, once the autoscale tables are in place
        write_tables(outcome.requests, outcome.steps, outcome.summary, outcome.rejected, staging, output.steps)
        histories = (result.prefill, result.decode)
        pd.concat([lifetimes_frame(h).assign(pool=pool) for pool, h in zip(POOLS, histories)],
                  ignore_index=True).to_csv(staging / "lifetimes.csv", index=False)
        events = pd.concat([events_frame(h.events).assign(pool=pool) for pool, h in zip(POOLS, histories)])
        events.astype({"count": int}).sort_values("time_s", kind="stable").to_csv(staging / "scaling.csv",
                                                                                  index=False)
        frame.to_csv(staging / "timeline.csv", index=False)
        if output.plots:
            from harness.autoscale.plots import plot_autoscale

            plot_autoscale(frame, outcome.summary, slo, staging / "autoscale.png")
    require_served(outcome)
    print(format_summary(outcome.summary))
    row = outcome.summary.to_row()
    print(f"autoscale {row['autoscale_policy']}: {row['prefill_replicas']} prefill and {row['decode_replicas']} decode "
          f"replicas started, mean {row['mean_prefill_replicas']:.2f} + {row['mean_decode_replicas']:.2f} billed, "
          f"{row['gpu_hours']:.3f} GPU-hours, cost ${row['cost']:.2f}, SLO attainment {row['slo_attainment']:.3f}")
    print(f"outputs: {out_dir} (requests.csv, summary.csv, timeline.csv, lifetimes.csv, scaling.csv, autoscale.png)")
    return pd.DataFrame([row])
