"""A disaggregated fleet run (fleet=disaggregated): P prefill and D decode simulated replicas.

engine.core.disagg_fleet runs them on one event clock; sim.kv_transfer prices each KV transfer.
Outputs, beside an aggregated fleet's: requests.csv gains prefill_replica, decode_replica (-1: the
request ended with its first token and moved nothing), queue_s and prefill_s (TTFT = queue_s +
prefill_s: the first token is sampled on the prefill replica), transfer_wait_s (back-pressure:
the first token to the transfer's start), transfer_start, transfer_s and transfer_bytes;
steps.csv gains pool; summary.csv gains transfer_p50_s/p90/p99, transfer_wait_p90_s and the pool
shapes; pools.png plots each pool's busy share and KV use over time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from tqdm import tqdm

from engine.core import make_scheduler
from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_fleet import run_disaggregated
from engine.core.disagg_types import DisaggResult
from engine.core.loop import RunResult, SimulatedClock
from engine.core.routers import RouterConfig, make_router
from harness.config import OutputConfig, RunConfig
from harness.convert import ConfigError
from harness.fleet.config import backend_tp_size
from harness.fleet.disagg_config import DisaggConfig, pool_run_configs, pool_staging_blocks
from harness.fleet.intake import fleet_intake, with_intake
from harness.labels import run_identity
from harness.output.metrics import STEP_COLUMNS, requests_frame, steps_frame, summarize, with_launches
from harness.output.summary import FitCounts, FleetLabels, RunLabels, RunSummary
from harness.run import cyclic_gc_paused, require_served, write_tables
from harness.workloads import build_workload

if TYPE_CHECKING:
    from harness.fidelity.fleet_interval import PoolPricing
    from sim.cost_model import CostModel
    from sim.interval import IntervalConfig

log = logging.getLogger(__name__)
POOLS = ("prefill", "decode")


@dataclass
class DisaggOutcome:
    requests: pd.DataFrame
    steps: pd.DataFrame  # pool and replica (index within its pool) columns
    summary: RunSummary
    pool_blocks: dict[str, list[int]]  # each replica's KV blocks, per pool
    rejected: dict[str, str] = field(default_factory=dict)


def run_disagg_once(rc: RunConfig, fleet: DisaggConfig, router: RouterConfig, progress: bool = True,
                    step_columns: tuple[str, ...] = STEP_COLUMNS, pricing: PoolPricing | None = None) -> DisaggOutcome:
    """Serve rc.workload on the disaggregated fleet to completion (engine replicas: harness.fleet.disagg_engine).
    pricing: each simulated replica's cost model, by pool (0 prefill, 1 decode; an interval's draw)."""
    pools = pool_run_configs(rc, fleet)
    if rc.backend == "engine":
        from harness.fleet.disagg_engine import run_engine_disagg

        return run_engine_disagg(rc, fleet, router, pools, progress, step_columns, _check_decode_cache, tabulate)
    from sim.kv_transfer import KVTransferPricer

    counts = (fleet.prefill_replicas, fleet.decode_replicas)
    staging = pool_staging_blocks(pools, counts)  # the engine's memory plan: KV link staging out of the cache
    executors = [[pool_executor(p, s, name, pricing(i, p) if pricing else None) for _ in range(n)]
                 for i, (p, n, s, name) in enumerate(zip(pools, counts, staging, POOLS))]
    infos = [ex[0].info() for ex in executors]
    workload = build_workload(rc.workload, rc.scheduler.max_model_len, infos[0].vocab_size)
    _check_decode_cache(workload.requests, infos[1].num_blocks, infos[1].block_size, rc.scheduler.max_model_len)
    prefill = [PrefillReplica(i, make_scheduler(pools[0].scheduler, infos[0], pools[0].cache), e, SimulatedClock())
               for i, e in enumerate(executors[0])]
    decode = [DecodeReplica(i, make_scheduler(pools[1].scheduler, infos[1], pools[1].cache), e, SimulatedClock())
              for i, e in enumerate(executors[1])]
    with_intake(prefill, fleet_intake(pools[0]))  # requests reach the prefill replicas' processes
    routers = [make_router(RouterConfig(name or router.name, router.prefix_blocks, router.max_imbalance),
                           rc.cache.block_size) for name in (fleet.prefill_router, fleet.decode_router)]
    tps = [backend_tp_size(p) for p in pools]
    pricer = KVTransferPricer(fleet.transfer, rc.model.with_kv_cache(rc.cache.kv_cache_dtype),
                              pools[0].hardware, pools[1].hardware, tps[0], tps[1])
    bar = tqdm(total=len(workload.requests), desc=f"{counts[0]}P{counts[1]}D x {rc.workload.label}", unit="req",
               disable=not progress, mininterval=0.5, leave=False, dynamic_ncols=True)
    started = time.perf_counter()
    with bar, cyclic_gc_paused():
        result = run_disaggregated(prefill, decode, workload.requests, routers[0], routers[1], pricer,
                                   (lambda i, record, finished: bar.update(len(finished))) if progress else None,
                                   fleet.transfer.handshake, fleet.transfer.sends_queue_behind_step(),
                                   fleet.transfer.receives_queue_behind_step(), fleet.transfer.landing_lag_s,
                                   fleet.transfer.send_lag_s, fleet.transfer.landing_lag_sigma,
                                   fleet.transfer.send_lag_sigma)
    wall_s = time.perf_counter() - started
    for ex in executors:
        for executor in ex:
            executor.shutdown()
    gpus = counts[0] * tps[0] + counts[1] * tps[1]
    shape = FleetLabels(router=f"{fleet.prefill_router or router.name} / {fleet.decode_router or router.name}",
                        replicas=sum(counts), tp_sizes=f"{tps[0]}P {tps[1]}D", gpus=gpus)
    hardware = f"{pools[0].hardware.name} / {pools[1].hardware.name}"
    labels = RunLabels(backend=rc.backend, **{**run_identity(rc), "hardware": hardware},
                       num_submitted=len(workload.requests), num_rejected=len(result.rejected),
                       fit=FitCounts(**workload.fit_counts()), wall_s=wall_s, fleet=shape)
    blocks = {"prefill": [infos[0].num_blocks] * counts[0], "decode": [infos[1].num_blocks] * counts[1]}
    return tabulate(result, blocks, labels, counts, step_columns)


@contextmanager
def disagg_server(rc: RunConfig, fleet: DisaggConfig, router: RouterConfig, progress: bool = True,
                  step_columns: tuple[str, ...] = STEP_COLUMNS):
    """The fleet built once; yields serve(workload) -> DisaggOutcome, which serves a WorkloadConfig on
    it to completion as often as called. Engine replicas are started and loaded once for every
    run (harness.fleet.disagg_engine); simulated ones cost nothing to build, so each run builds them."""
    if rc.backend == "engine":
        from harness.fleet.disagg_engine import engine_disagg_server

        with engine_disagg_server(rc, fleet, router, pool_run_configs(rc, fleet), step_columns, _check_decode_cache,
                                  tabulate) as serve:
            yield serve
        return
    yield lambda workload: run_disagg_once(dataclasses.replace(rc, workload=workload), fleet, router, progress,
                                           step_columns)


def pool_executor(pool: RunConfig, staging_blocks: int, name: str, cost_model: CostModel | None = None):
    """A simulated replica of a pool (its run config) with its KV link staging; a memory plan that does
    not fit (the model, or the staging, on the pool's GPU) is a ConfigError naming the pool.
    cost_model: prices its steps instead of the pool's configured one (an interval's draw)."""
    from sim import build_sim_executor

    try:
        return build_sim_executor(pool.model, pool.hardware, pool.sim, pool.cache, pool.scheduler, cost_model,
                                  staging_blocks=staging_blocks)
    except ValueError as error:
        raise ConfigError(f"backend=sim: fleet.{name}: {error}") from None


def _check_decode_cache(requests, num_blocks: int, block_size: int, max_model_len: int) -> None:
    """A ConfigError when the decode pool's cache cannot hold the workload's largest request."""
    def need(r) -> int:
        max_tokens = r.sampling_params.max_tokens or max_model_len - r.num_prompt_tokens
        return -(-(r.num_prompt_tokens + max_tokens - 1) // block_size)

    largest = max(map(need, requests), default=0)
    if largest > num_blocks:
        raise ConfigError(f"fleet.decode: a decode replica's KV cache holds {num_blocks} blocks of {block_size} "
                          f"tokens, but the workload's largest request needs {largest}: give the decode pool "
                          "more memory (fleet.decode.hardware, fleet.decode.tp_size) or cache.num_blocks")


def tabulate(result: DisaggResult, blocks: dict[str, list[int]], labels: RunLabels, counts: tuple[int, int],
             step_columns: tuple[str, ...] = STEP_COLUMNS) -> DisaggOutcome:
    requests = requests_frame(RunResult(result.requests, []))
    t = result.transfers
    ids = requests["request_id"]

    def get(name: str, default: object) -> list:
        return [getattr(t[r], name) if r in t else default for r in ids]

    requests["prefill_replica"] = get("prefill", -1)
    requests["decode_replica"] = get("decode", -1)
    requests["queue_s"] = requests["first_scheduled"] - requests["arrival"]
    requests["prefill_s"] = requests["first_token"] - requests["first_scheduled"]
    moved = requests["decode_replica"] >= 0
    start = np.array(get("start_s", np.nan), dtype=float)
    requests["transfer_start"] = np.where(moved, start, np.nan)
    requests["transfer_wait_s"] = np.where(moved, start - requests["first_token"], np.nan)
    requests["transfer_s"] = np.where(moved, np.array(get("transfer_s", np.nan), dtype=float), np.nan)
    requests["transfer_bytes"] = np.where(moved, get("bytes", 0), 0)
    steps = []
    for pool, runs in zip(POOLS, (result.prefill, result.decode)):
        for index, run in enumerate(runs):
            steps.append(with_launches(steps_frame(run, step_columns), run).assign(pool=pool, replica=index))
    all_steps = pd.concat(steps, ignore_index=True)
    summary = summarize(requests, all_steps, result.makespan_s, sum(map(sum, blocks.values())), labels)
    transfer = requests.loc[moved, "transfer_s"]
    extras: dict[str, float | int] = {f"transfer_p{q}_s": float(transfer.quantile(q / 100)) if len(transfer) else np.nan
                                      for q in (50, 90, 99)}
    wait = requests.loc[moved, "transfer_wait_s"]
    extras["transfer_wait_p90_s"] = float(wait.quantile(0.9)) if len(wait) else np.nan
    extras["transfer_mb_mean"] = float(requests.loc[moved, "transfer_bytes"].mean() / 1e6) if len(transfer) else np.nan
    extras["prefill_replicas"], extras["decode_replicas"] = counts
    extras["max_blocked"] = result.max_blocked
    if result.rejected:
        log.warning("%d of %d requests were rejected, e.g. %s: %s", len(result.rejected), labels.num_submitted,
                    *next(iter(result.rejected.items())))
    return DisaggOutcome(requests, all_steps, summary.with_extras(extras), blocks, dict(result.rejected))


def run_disagg_study(rc: RunConfig, fleet: DisaggConfig, router: RouterConfig, output: OutputConfig,
                     out_dir: Path, interval: IntervalConfig | None = None) -> pd.DataFrame:
    """`python -m harness fleet=disaggregated ...`: one run, its tables and pools.png in out_dir; with
    an interval, the summary gains its latencies' bounds (harness.fidelity.fleet_interval)."""
    from harness.report import format_summary

    if interval is None:
        outcome = run_disagg_once(rc, fleet, router, output.progress)
    else:
        from harness.fidelity.fleet_interval import fleet_with_interval
        from harness.output.metrics import SUMMARY_STEP_COLUMNS

        def run(pricing: PoolPricing | None, label: str) -> DisaggOutcome:
            # a draw is read for its summary alone: the step tables' few columns it needs
            return run_disagg_once(rc, fleet, router, output.progress,
                                   SUMMARY_STEP_COLUMNS if pricing else STEP_COLUMNS, pricing)

        outcome = fleet_with_interval(rc, interval, pool_run_configs(rc, fleet), run)
    write_tables(outcome.requests, outcome.steps, outcome.summary, outcome.rejected, out_dir, output.steps)
    if output.plots:
        from harness.fleet.disagg_plots import plot_pools

        plot_pools(outcome, out_dir / "pools.png")
    require_served(outcome)
    print(format_summary(outcome.summary))
    row = outcome.summary.to_row()
    # means, since they add up as each request's parts do; percentiles of the parts would not
    parts = outcome.requests[["queue_s", "prefill_s", "ttft"]].mean()
    print(f"TTFT = queue + prefill (mean {parts['queue_s']:.4f} s + {parts['prefill_s']:.4f} s = "
          f"{parts['ttft']:.4f} s); KV transfer P50/P90/P99 "
          f"{row['transfer_p50_s']:.5f} / {row['transfer_p90_s']:.5f} / {row['transfer_p99_s']:.5f} s, "
          f"mean {row['transfer_mb_mean']:.1f} MB, back-pressure wait P90 {row['transfer_wait_p90_s']:.4f} s")
    print(f"outputs: {out_dir} (requests.csv, steps.csv.gz, summary.csv, pools.png)")
    return pd.DataFrame([row])
