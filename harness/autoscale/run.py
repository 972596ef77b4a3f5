"""An autoscaled run: a simulated fleet that an autoscaling policy sizes over time.

`python -m harness ... autoscale.policy=<name>` (fleet.replicas: the starting count). Outputs: the
fleet's tables (requests.csv, steps.csv.gz, summary.csv with gpu_hours, cost and SLO attainment,
replica_<i>/), lifetimes.csv (each replica's requested, ready, drain and stop times), scaling.csv
(each scale-up and scale-down), timeline.csv (per window: arrival rate, replicas by state, KV use,
latency percentiles, SLO attainment) and autoscale.png (all of it against time).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from engine.core.elastic import ColdStart, ElasticResult, ScaleEvent, ScalingPolicy
from engine.core.routers import RouterConfig, make_router
from harness.autoscale.calibration import find_calibration
from harness.autoscale.config import (
    SLO,
    AutoscaleConfig,
    check_evaluations,
    check_fleet,
    check_report_windows,
    last_arrival,
)
from harness.autoscale.fleets import elastic_fleet
from harness.autoscale.policies import make_policy
from harness.autoscale.timeline import (
    TIMELINE_STEP_COLUMNS,
    attains,
    gpu_hours,
    peak_replicas,
    state_spans,
    timeline,
)
from harness.config import OutputConfig, RunConfig
from harness.convert import ConfigError, refuse_unread
from harness.fleet.config import FleetConfig, backend_tp_size, replica_run_configs
from harness.fleet.run import FleetOutcome, tabulate, write_fleet_outcome
from harness.labels import run_identity
from harness.output.metrics import STEP_COLUMNS
from harness.output.summary import FitCounts, FleetLabels, RunLabels
from harness.run import require_served
from harness.run_folder import staged
from harness.workloads import build_workload

log = logging.getLogger(__name__)


@dataclass
class AutoscaleOutcome:
    fleet: FleetOutcome  # its summary carries the cost and SLO columns
    elastic: ElasticResult
    timeline: pd.DataFrame
    cold_start: ColdStart

    @property
    def summary(self):
        return self.fleet.summary


def cold_start_of(rc: RunConfig, autoscale: AutoscaleConfig, tp_size: int, where: str = "autoscale") -> ColdStart:
    """The configured start-up: provisioning, then the engine's measured cold start on this hardware
    and model (harness.autoscale.calibration) where autoscale.calibration is on and there is one;
    otherwise each rank's weight bytes at the hardware's load bandwidth and graph_capture_s. No graph
    capture with execution.enforce_eager."""
    eager = (rc.sim if rc.backend == "sim" else rc.engine).execution.enforce_eager
    weight_bytes = rc.model.weight_bytes_per_rank(tp_size)
    calibration = find_calibration(rc.hardware.name, rc.model.name, tp_size) if autoscale.calibration else None
    if calibration is not None:
        try:  # the measured capture prices the start: a placeholder set beside it would be silently dropped
            refuse_unread(autoscale, where, [("graph_capture_s", f"{where}.calibration=false")],
                          f"the cold start measured in {calibration.path}")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        log.info("a new replica's start-up: the cold start measured in %s (its weights read %s)", calibration.path,
                 calibration.weight_read)
        return calibration.cold_start(autoscale.provision_s, weight_bytes, eager)
    bandwidth = rc.hardware.weight_load_bytes_per_s
    if bandwidth is None:
        raise ConfigError(f"hardware.weight_load_bytes_per_s is not set for {rc.hardware.name}: an autoscaled "
                          "fleet needs it to price a new replica's weight load")
    cold = autoscale.cold_start(weight_bytes, bandwidth)
    return cold if not eager else dataclasses.replace(cold, capture_s=0.0)


def run_autoscaled(rc: RunConfig, fleet: FleetConfig, router: RouterConfig, autoscale: AutoscaleConfig, slo: SLO,
                   progress: bool = True, cold_start: ColdStart | None = None, label: str = "",
                   step_columns: tuple[str, ...] = STEP_COLUMNS,
                   policy: ScalingPolicy | None = None) -> AutoscaleOutcome:
    """Serve rc.workload on a fleet of fleet.replicas ready replicas that autoscale.policy scales
    (null: a static fleet); cold_start overrides the configured start-up (the cold-start study),
    policy the one autoscale.policy makes (experiments.autoscale.slo_decisions: one that records).
    Engine replicas (backend=engine) start as processes and take traffic once loaded: their
    start-up is measured, not priced."""
    check_fleet(autoscale, fleet.replicas, fleet.tp_sizes, rc.backend)
    one = replica_run_configs(rc, dataclasses.replace(fleet, replicas=1))[0]
    tp = backend_tp_size(one)
    if rc.backend == "engine":
        cold = ColdStart()  # the processes take what they take: cold_start_s is measured (_extras)
    else:
        cold = cold_start if cold_start is not None else cold_start_of(rc, autoscale, tp)
    with elastic_fleet(rc, one, fleet.replicas, autoscale) as replicas:
        info = replicas.info
        workload = build_workload(rc.workload, rc.scheduler.max_model_len, info.vocab_size)
        span = last_arrival(workload.requests)
        if autoscale.policy is not None:
            check_evaluations(autoscale.interval_s, span, "autoscale")
        check_report_windows(autoscale.report_window_s, span, "autoscale")
        bar = tqdm(total=len(workload.requests), desc=label or f"autoscale {autoscale.policy} x {rc.workload.label}",
                   unit="req", disable=not progress, mininterval=0.5, leave=False, dynamic_ncols=True)
        started = time.perf_counter()
        with bar:
            result = replicas.serve(workload.requests, make_router(router, rc.cache.block_size),
                                    dataclasses.replace(autoscale.scaling(cold), limits=replicas.limits),
                                    make_policy(autoscale, slo) if policy is None else policy,
                                    (lambda i, record, finished: bar.update(len(finished))) if progress else None)
        wall_s = time.perf_counter() - started
        blocks = replicas.blocks(len(result.lifetimes))
    lifetimes = result.lifetimes
    gpus = peak_replicas(lifetimes) * tp
    shape = FleetLabels(router=router.name, replicas=len(lifetimes), tp_sizes=str(tp), gpus=gpus)
    labels = RunLabels(backend=rc.backend, **run_identity(rc), num_submitted=len(workload.requests), num_rejected=0,
                       fit=FitCounts(**workload.fit_counts()), wall_s=wall_s, fleet=shape)
    outcome = tabulate(result.fleet, blocks, labels, step_columns)
    check_report_windows(autoscale.report_window_s, result.fleet.makespan_s, "autoscale")
    frame = timeline(outcome.requests, outcome.steps, lifetimes, info.num_blocks, autoscale.report_window_s,
                     result.fleet.makespan_s, slo)
    cold_start_s = measured_start_up_s(result) if rc.backend == "engine" else cold.total_s
    outcome.summary = outcome.summary.with_extras(_extras(outcome, result, autoscale, slo, cold_start_s, tp, rc))
    return AutoscaleOutcome(outcome, result, frame, cold)


def measured_start_up_s(result: ElasticResult) -> float:
    """The mean start-up (request to ready) of the replicas started during the run that became
    ready; NaN where none did."""
    times = [life.ready_s - life.requested_s for life in result.lifetimes
             if life.requested_s > 0 and math.isfinite(life.ready_s) and not life.cancelled]
    return sum(times) / len(times) if times else math.nan


def _extras(outcome: FleetOutcome, result: ElasticResult, autoscale: AutoscaleConfig, slo: SLO,
            cold_start_s: float, tp: int, rc: RunConfig) -> dict:
    hours = gpu_hours(result.lifetimes, tp)
    price = rc.hardware.price_per_gpu_hour
    end = result.fleet.makespan_s
    attainment = float(attains(outcome.requests, slo).mean()) if slo.is_set and len(outcome.requests) else float("nan")
    return {"autoscale_policy": autoscale.policy or "static", "gpu_hours": hours,
            "cost": hours * price if price is not None else float("nan"),
            "mean_replicas": hours * 3600.0 / (tp * end) if end > 0 else float("nan"),
            "scale_ups": sum(e.direction == "up" for e in result.events),
            "scale_downs": sum(e.direction == "down" for e in result.events),
            "cold_start_s": cold_start_s, "slo_attainment": attainment,
            "slo_met": bool(attainment >= slo.target_attainment) if slo.is_set else None}


def lifetimes_frame(result: ElasticResult) -> pd.DataFrame:
    rows = []
    for life in result.lifetimes:
        spans = state_spans(life)
        rows.append({"replica": life.index, "requested_s": life.requested_s, "ready_s": spans["serving"][0],
                     "drain_s": life.drain_s, "stop_s": life.stop_s, "cancelled": life.cancelled})
    return pd.DataFrame(rows)


def events_frame(events: list[ScaleEvent]) -> pd.DataFrame:
    return pd.DataFrame({"time_s": [e.time_s for e in events], "direction": [e.direction for e in events],
                         "count": [len(e.replicas) for e in events],
                         "replicas": [" ".join(map(str, e.replicas)) for e in events]})


def write_autoscale_outcome(outcome: AutoscaleOutcome, out_dir: Path, output: OutputConfig, slo: SLO) -> None:
    """The fleet's tables, lifetimes.csv, scaling.csv, timeline.csv and autoscale.png, all moved into
    out_dir once written (summary.csv last: harness.run_folder.staged)."""
    with staged(out_dir) as staging:
        write_fleet_outcome(outcome.fleet, staging, plots=False, steps=output.steps)
        lifetimes_frame(outcome.elastic).to_csv(staging / "lifetimes.csv", index=False)
        events_frame(outcome.elastic.events).to_csv(staging / "scaling.csv", index=False)
        outcome.timeline.to_csv(staging / "timeline.csv", index=False)
        if output.plots:
            from harness.autoscale.plots import plot_autoscale

            plot_autoscale(outcome.timeline, outcome.summary, slo, staging / "autoscale.png")


def run_autoscale_study(rc: RunConfig, fleet: FleetConfig, router: RouterConfig, autoscale: AutoscaleConfig,
                        slo: SLO, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    """`python -m harness autoscale.policy=<name> ...`: one autoscaled run, its tables and plot."""
    from harness.report import format_summary

    columns = STEP_COLUMNS if output.steps == "full" else TIMELINE_STEP_COLUMNS
    outcome = run_autoscaled(rc, fleet, router, autoscale, slo, output.progress, step_columns=columns)
    write_autoscale_outcome(outcome, out_dir, output, slo)
    require_served(outcome.fleet)
    row = outcome.summary.to_row()
    print(format_summary(outcome.summary))
    print(f"autoscale {row['autoscale_policy']}: {row['replicas']} replicas started, mean {row['mean_replicas']:.2f} "
          f"billed, {row['gpu_hours']:.3f} GPU-hours, cost ${row['cost']:.2f},"
          f" SLO attainment {row['slo_attainment']:.3f}, cold start {row['cold_start_s']:.0f} s")
    print(f"outputs: {out_dir} (requests.csv, summary.csv, timeline.csv, lifetimes.csv, scaling.csv, autoscale.png)")
    return pd.DataFrame([row])
