"""A fleet run: N replicas behind a router, tabulated per replica and for the whole fleet.

Simulated replicas share one event clock (engine.core.fleet.run_fleet); engine replicas run their
own loops, one process each (engine.replicas), fed by the router on the wall clock
(run_fleet_wall). Outputs: requests.csv and steps.csv of the fleet (a `replica` column),
summary.csv (the fleet's row), replica_<i>/ with each replica's three tables, load.png
(outstanding requests and KV use per replica over time) and latency_cdf.png (the fleet's TTFT,
TPOT and end-to-end CDFs).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tqdm import tqdm

if TYPE_CHECKING:
    from harness.fidelity.fleet_interval import PoolPricing
    from sim import SampledTokens
    from sim.interval import IntervalConfig

from engine.core import make_scheduler
from engine.core.fleet import FleetResult, run_fleet, run_fleet_wall
from engine.core.loop import Replica, SimulatedClock, WallClock
from engine.core.records import StepTotals
from engine.core.routers import RouterConfig, make_router
from harness.config import OutputConfig, RunConfig
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig, backend_tp_size, replica_run_configs
from harness.fleet.intake import fleet_intake
from harness.labels import run_identity
from harness.output.metrics import STEP_COLUMNS, requests_frame, steps_frame, summarize, with_launches
from harness.output.summary import FitCounts, FleetLabels, RunLabels, RunSummary
from harness.run import cyclic_gc_paused, require_served, write_tables
from harness.run_folder import staged
from harness.workloads import WorkloadConfig, build_workload
from harness.workloads.prepared import Drawn, PreparedWorkload

log = logging.getLogger(__name__)


@dataclass
class FleetOutcome:
    requests: pd.DataFrame  # every replica's requests, with a replica column
    steps: pd.DataFrame  # every replica's steps, with a replica column
    summary: RunSummary  # the fleet's row
    replica_summaries: list[RunSummary]
    replica_blocks: list[int]
    rejected: dict[str, str] = field(default_factory=dict)


@contextmanager
def _fleet(rc: RunConfig, rcs: list[RunConfig], keep_steps: bool = True, samples: SampledTokens | None = None,
           pricing: PoolPricing | None = None):
    """The replicas of rcs, built: yields their BackendInfos and serve(requests, router, on_step),
    which runs a workload on them to completion; stops them afterwards. keep_steps=False:
    simulated replicas keep only their step totals (engine replicas report every step); samples:
    simulated replicas read the tokens they sample from these (sim.sampled); pricing: each
    simulated replica's cost model, the fleet one pool (an interval's draw), else rc.sim's."""
    try:
        built = (_engine_fleet(rc, rcs) if rc.backend == "engine"
                 else _sim_fleet(rcs, keep_steps, samples, pricing))
        infos, serve = next(built)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"backend={rc.backend}: {error}") from None
    try:
        yield infos, serve
    finally:
        built.close()


def _sim_fleet(rcs: list[RunConfig], keep_steps: bool, samples: SampledTokens | None = None,
               pricing: PoolPricing | None = None):
    from sim import build_sim_executor

    executors = [build_sim_executor(r.model, r.hardware, r.sim, r.cache, r.scheduler,
                                    pricing(0, r) if pricing else None, samples=samples) for r in rcs]
    infos = [e.info() for e in executors]
    intakes = [fleet_intake(r) for r in rcs]  # the engine fleet's replicas are processes: its hand-over

    def serve(requests, route, on_step) -> FleetResult:
        replicas = [Replica(i, make_scheduler(rc.scheduler, info, rc.cache), e, SimulatedClock())
                    for i, (e, info, rc) in enumerate(zip(executors, infos, rcs))]
        for replica, intake in zip(replicas, intakes):
            replica.intake = intake
        if not keep_steps:
            for replica in replicas:
                replica.result.step_totals = StepTotals()
        with cyclic_gc_paused():
            return run_fleet(replicas, requests, route, on_step)

    try:
        yield infos, serve
    finally:
        for executor in executors:
            executor.shutdown()


def _engine_fleet(rc: RunConfig, rcs: list[RunConfig]):
    from engine.replicas import EngineReplicas
    from harness.checkpoints import ensure_checkpoint

    ensure_checkpoint(rc.engine.model, rc.model)
    engines = EngineReplicas([r.engine for r in rcs], rc.scheduler, rc.cache)

    def serve(requests, route, on_step) -> FleetResult:
        clock = WallClock()
        engines.start_run(clock)  # each replica's loop reads a clock of this origin
        return run_fleet_wall(engines, requests, route, clock, on_step)

    with engines:
        yield engines.infos, serve


def run_fleet_once(rc: RunConfig, fleet: FleetConfig, router: RouterConfig, progress: bool = True,
                   label: str = "", step_columns: tuple[str, ...] = STEP_COLUMNS,
                   keep_steps: bool = True, prepared: PreparedWorkload | None = None,
                   pricing: PoolPricing | None = None) -> FleetOutcome:
    """Serve rc.workload on the fleet to completion. step_columns: those of the step tables
    (harness.output.metrics.SUMMARY_STEP_COLUMNS where only the summaries are read);
    keep_steps=False: a simulated fleet records no steps, only the totals its summaries need
    (engine.core.records.StepTotals): the same summaries, empty step tables; prepared: the
    workload's requests made ahead (harness.workloads.prepared), served where they were made for
    this workload, length limit, vocabulary and block size (the same requests either way);
    pricing: each simulated replica's cost model (harness.fidelity.fleet_interval's draws)."""
    with fleet_server(rc, fleet, router, progress, step_columns, keep_steps, prepared, pricing) as serve:
        return serve(rc.workload, label)


@contextmanager
def fleet_server(rc: RunConfig, fleet: FleetConfig, router: RouterConfig, progress: bool = True,
                 step_columns: tuple[str, ...] = STEP_COLUMNS, keep_steps: bool = True,
                 prepared: PreparedWorkload | None = None, pricing: PoolPricing | None = None):
    """The fleet's replicas, built once (engine replicas: their processes started and loaded);
    yields serve(workload, label="") -> FleetOutcome, which serves a WorkloadConfig on them to
    completion, as often as called (each run builds fresh schedulers); stops them afterwards.
    prepared, pricing: as run_fleet_once's."""
    rcs = replica_run_configs(rc, fleet)
    with _fleet(rc, rcs, keep_steps, prepared.samples if prepared else None, pricing) as (infos, serve_requests):
        def serve(workload: WorkloadConfig, label: str = "") -> FleetOutcome:
            run_rc = replace(rc, workload=workload)
            drawn = Drawn(workload, rc.scheduler.max_model_len, infos[0].vocab_size, rc.cache.block_size)
            if prepared is not None and prepared.drawn == drawn:
                built, requests = prepared.workload, prepared.requests()
            else:
                built = build_workload(workload, rc.scheduler.max_model_len, infos[0].vocab_size)
                requests = built.requests
            bar = tqdm(total=len(requests), desc=label or f"{fleet.replicas} x {workload.label}", unit="req",
                       disable=not progress, mininterval=0.5, leave=False, dynamic_ncols=True)

            def on_step(index, record, finished) -> None:
                if finished:
                    bar.update(len(finished))

            started = time.perf_counter()
            with bar:
                result = serve_requests(requests, make_router(router, rc.cache.block_size),
                                        on_step if progress else None)
            wall_s = time.perf_counter() - started
            tp_sizes = [backend_tp_size(r) for r in rcs]
            shape = FleetLabels(router=router.name, replicas=fleet.replicas, tp_sizes=" ".join(map(str, tp_sizes)),
                                gpus=sum(tp_sizes))
            labels = RunLabels(backend=rc.backend, **run_identity(run_rc), num_submitted=len(requests),
                               num_rejected=0, fit=FitCounts(**built.fit_counts()), wall_s=wall_s, fleet=shape)
            return tabulate(result, [info.num_blocks for info in infos], labels, step_columns)

        yield serve


def tabulate(result: FleetResult, replica_blocks: list[int], labels: RunLabels,
             step_columns: tuple[str, ...] = STEP_COLUMNS) -> FleetOutcome:
    """Per-replica and fleet tables and summaries of a FleetResult; labels' num_rejected is counted here."""
    requests, steps, summaries, rejected = [], [], [], {}
    for index, (replica, blocks) in enumerate(zip(result.replicas, replica_blocks)):
        req, st = requests_frame(replica), with_launches(steps_frame(replica, step_columns), replica)
        rejected.update(replica.rejected)
        mine = replace(labels, replica=index, num_rejected=len(replica.rejected))
        summaries.append(summarize(req, st, replica.makespan_s, blocks, mine, replica.step_totals))
        requests.append(req.assign(replica=index))
        steps.append(st.assign(replica=index))
    fleet_requests = pd.concat(requests, ignore_index=True)
    fleet_steps = pd.concat(steps, ignore_index=True)
    summary = summarize(fleet_requests, fleet_steps, result.makespan_s, sum(replica_blocks),
                        replace(labels, num_rejected=len(rejected)), _fleet_totals(result))
    if rejected:
        log.warning("%d of %d requests were rejected at admission, e.g. %s: %s", len(rejected),
                    labels.num_submitted, *next(iter(rejected.items())))
    return FleetOutcome(fleet_requests, fleet_steps, summary, summaries, replica_blocks, rejected)


def _fleet_totals(result: FleetResult) -> StepTotals | None:
    """The replicas' step totals summed; None where a replica kept its steps."""
    totals = [replica.step_totals for replica in result.replicas if replica.step_totals is not None]
    if len(totals) < len(result.replicas):
        return None
    return StepTotals(sum(t.count for t in totals), sum(t.prefill_tokens for t in totals),
                      sum(t.requests for t in totals))


def write_fleet_outcome(outcome: FleetOutcome, out_dir: Path, plots: bool = True, steps: str = "full") -> None:
    """The fleet's tables, each replica's in replica_<i>/ and the plots, all moved into out_dir once
    written (summary.csv last: harness.run_folder.staged), so a stopped write leaves no complete run."""
    with staged(out_dir) as staging:
        write_tables(outcome.requests, outcome.steps, outcome.summary, outcome.rejected, staging, steps)
        for index, row in enumerate(outcome.replica_summaries):
            mine = outcome.requests["replica"] == index
            write_tables(outcome.requests[mine], outcome.steps[outcome.steps["replica"] == index], row, {},
                         staging / f"replica_{index}", steps)
        if plots:
            from harness.fleet.plots import plot_fleet_latency, plot_fleet_load

            plot_fleet_load(outcome, staging / "load.png")
            plot_fleet_latency(outcome, staging / "latency_cdf.png")


def run_fleet_study(rc: RunConfig, fleet: FleetConfig, router: RouterConfig, output: OutputConfig,
                    out_dir: Path, interval: IntervalConfig | None = None) -> pd.DataFrame:
    """`python -m harness fleet.replicas=N ...`: one fleet run, its tables and plots in out_dir;
    with an interval, the fleet's summary gains its latencies' bounds (harness.fidelity.fleet_interval)."""
    from harness.report import format_summary

    if interval is None:
        outcome = run_fleet_once(rc, fleet, router, output.progress)
    else:
        from harness.fidelity.fleet_interval import fleet_with_interval
        from harness.output.metrics import SUMMARY_STEP_COLUMNS

        def run(pricing: PoolPricing | None, label: str) -> FleetOutcome:
            # a draw is read for its summary alone: no step tables kept
            return run_fleet_once(rc, fleet, router, output.progress, label,
                                  SUMMARY_STEP_COLUMNS if pricing else STEP_COLUMNS, pricing is None, pricing=pricing)

        outcome = fleet_with_interval(rc, interval, replica_run_configs(rc, fleet)[:1], run)
    write_fleet_outcome(outcome, out_dir, output.plots, output.steps)
    require_served(outcome)
    print(format_summary(outcome.summary))
    per_replica = pd.DataFrame([s.to_row() for s in outcome.replica_summaries])
    print(per_replica[["replica", "num_requests", "ttft_p90_s", "tpot_p90_s", "output_tok_s"]].to_string(index=False))
    print(f"outputs: {out_dir} (requests.csv, steps.csv.gz, summary.csv, replica_*/, load.png, latency_cdf.png)")
    return pd.DataFrame([outcome.summary.to_row()])
