"""`python -m harness experiment=fidelity`: the held-out protocol as one run: calibrate on a
profiling grid, then predict workloads the fit never saw.

The engine (backend=engine) is profiled on the grid (or a given profile is used): the only thing
the profiled model is fitted on. Then for each workload class (harness.fidelity.classes), none of
which the fit saw:
1. capacity: the class served offline by the engine once unmeasured (warmup), then `repeats`
   times; its request throughput (requests over the time to drain them) is the engine's capacity
   for that class, and also a cell of its own (load "offline": the throughput a simulation must
   match where arrivals do not bound it). The offline cell's schedules are compared step by step:
   each engine repeat against each simulated run and against repeat 0 (harness.fidelity.schedules);
2. for each load in `loads`, the class's arrivals at load x capacity, served by the engine
   `repeats` times (engine = their mean, engine_spread = (max - min) / mean) and simulated with
   each cost model with the engine's block count and graphs; the profiled model with a
   prediction interval (sim.interval). loads=[]: an offline-only run (step 1 alone).
Written to results_dir (default: the run directory): heldout.csv (model, hardware, workload,
load, metric, engine, sim, err, cost_model, engine_spread, sim_lo, sim_hi, in_interval, rate_req_s),
schedules.csv (model, hardware, workload, cost_model, engine_repeat, schedule_identical,
first_divergent_step, engine_steps, sim_steps, identical_steps, engine_preemptions,
sim_preemptions: one row per class, engine repeat and simulated run of the offline cell, plus
cost model "engine_repeat" rows, each later repeat against repeat 0) and heldout.png (error
against load per workload; not written for an offline-only run). Only these summaries: per-step
tables stay in memory, never in results_dir; fidelity.steps_dir, where set, gets each engine run's
steps priced by each cost model (harness.fidelity.steps).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from harness.compare.study import GRIDS, engine_meta, refuse_engine_without_gpu, sim_run_config
from harness.config import OutputConfig, RunConfig, build_run_config, existing_path, section
from harness.convert import ConfigError, to_dataclass
from harness.fidelity import classes
from harness.fidelity.calibrate import calibrated_model
from harness.fidelity.interval import simulate_with_interval
from harness.fidelity.report import (
    COUNTED_METRICS,
    LOAD_METRICS,
    OFFLINE_METRICS,
    at_measured_host,
    cell_rows,
    plot_heldout,
)
from harness.fidelity.schedules import schedule_rows, schedules_frame
from harness.run import RunOutcome, make_executor, run_once
from harness.shared_executor import KeepAlive
from sim.cost_model import COST_MODELS
from sim.interval import IntervalConfig
from sim.moe_groups import check_shared
from sim.moe_locality import check_locality

if TYPE_CHECKING:
    from harness.study import StudyConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FidelityConfig:
    workloads: tuple[str, ...] = classes.CLASSES
    loads: tuple[float, ...] = (0.5, 0.8, 0.95)
    repeats: int = 2  # engine runs per cell
    num_requests: int = 200
    length_scale: float = 1.0  # lengths of the classes x this (CPU: 1/16)
    preempt_num_blocks: int | None = None  # the preempting bench's pool; None: sized to preempt
    warmup: bool = True  # serve each class once, unmeasured, before its cells
    profile_path: str | None = None  # a step-timing table (fitted and validated here) or saved coefficients
    grid: str = "full"  # null profile_path: profile the engine with this grid first
    cost_models: tuple[str, ...] = COST_MODELS.names()
    # a profiled model fitted on another GPU and carried to this run's hardware
    # (experiments/fidelity/transfer_model.py): its predictions are cost model "carried"
    carried_profile_path: str | None = None
    interval: IntervalConfig = IntervalConfig()
    results_dir: str | None = None  # null: the run directory
    steps_dir: str | None = None  # each engine run's steps priced by each cost model (harness.fidelity.steps)
    # an MoE model's routing skew for the simulations; None: measured on the grid (harness.fidelity.routing)
    moe_routing_skew: float | None = None
    # how alike one sequence's tokens route (sim.moe_locality); None: fitted to the grid's per-step
    # expert counts where it has them, else 0 (harness.fidelity.routing)
    moe_routing_locality: float | None = None
    # sequences that start with the same tokens priced as routing groups (sim.features.routing_sequences);
    # None: decided on the grid's shared-prefix rows where it has per-step counts, else false
    moe_routing_shared_prefix: bool | None = None
    # how alike a group's members route (sim.moe_shared_prefix); None: fitted to those rows where it has them
    moe_routing_shared_fresh: float | None = None
    moe_routing_shared_cap: int | None = None
    # the profiled rows priced at the speed of the host that served each cell, where its runs' decode graph
    # launches measure it (harness.fidelity.serving_host; the profile's host beside them as profiled_grid_host)
    price_serving_host: bool = True
    # a step onto an idle device first waits the host's measured idle_start_host_s (backend.idle_start);
    # None: where measured, for a profile without lead fits (which price it already; sim.idle_start_s)
    idle_start: bool | None = None

    def __post_init__(self) -> None:
        bad = [w for w in self.workloads if w not in classes.CLASSES]
        if bad or not self.workloads:
            raise ValueError(f"fidelity.workloads must be a non-empty subset of {classes.CLASSES}, "
                             f"got {self.workloads}")
        # empty: an offline-only run (capacity, offline cells and schedules)
        if not all(0.0 < x <= 1.5 for x in self.loads):
            raise ValueError(f"fidelity.loads must be fractions of capacity in (0, 1.5] ([] for offline cells only), "
                             f"got {list(self.loads)}")
        checked = [("repeats", 2), ("num_requests", 1)]
        if self.preempt_num_blocks is not None:  # None: sized to the class
            checked.append(("preempt_num_blocks", 1))
        for name, low in checked:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"fidelity.{name} must be an int >= {low}, got {value!r}")
        if not 0.0 < self.length_scale <= 1.0:
            raise ValueError(f"fidelity.length_scale must be in (0, 1], got {self.length_scale!r}")
        if self.grid not in GRIDS:
            raise ValueError(f"fidelity.grid must be one of {GRIDS}, got {self.grid!r}")
        if not self.cost_models or any(c not in COST_MODELS for c in self.cost_models):
            raise ValueError(f"fidelity.cost_models must be a non-empty subset of {list(COST_MODELS.names())}, "
                             f"got {self.cost_models}")
        if not isinstance(self.price_serving_host, bool):
            raise ValueError(f"fidelity.price_serving_host must be true or false, got {self.price_serving_host!r}")
        if self.idle_start is not None and not isinstance(self.idle_start, bool):
            raise ValueError(f"fidelity.idle_start must be null (where measured), true or false, "
                             f"got {self.idle_start!r}")
        skew = self.moe_routing_skew
        if skew is not None and (isinstance(skew, bool) or not isinstance(skew, (int, float)) or not 0 <= skew < 9):
            raise ValueError(f"fidelity.moe_routing_skew must be null (measured) or a number in [0, 8], got {skew!r}")
        if self.moe_routing_locality is not None:
            check_locality(self.moe_routing_locality, "fidelity.moe_routing_locality")
        if self.moe_routing_shared_prefix not in (None, True, False):
            raise ValueError(f"fidelity.moe_routing_shared_prefix must be null (measured), true or false, "
                             f"got {self.moe_routing_shared_prefix!r}")
        try:
            check_shared(self.moe_routing_shared_fresh, self.moe_routing_shared_cap)
        except ValueError as error:
            raise ValueError(f"fidelity.{error}") from None


class PinnedBlocks(KeepAlive):
    """The shared engine with its scheduler shown only the first num_blocks KV blocks (a pinned cache)."""

    def __init__(self, inner, num_blocks: int | None) -> None:
        super().__init__(inner)
        self.num_blocks = num_blocks

    def info(self):
        info = self.inner.info()
        if self.num_blocks is None:
            return info
        if self.num_blocks > info.num_blocks:
            raise ConfigError(f"fidelity.preempt_num_blocks={self.num_blocks} exceeds the engine's "
                              f"{info.num_blocks} blocks")
        return dataclasses.replace(info, num_blocks=self.num_blocks)


def cell_meta(engine, rc: RunConfig, outcome: RunOutcome, moe: dict[str, float | bool | None],
              idle_start: bool | None = False) -> dict:
    """What the simulations of a cell take from its engine runs (harness.compare.study.engine_meta),
    with the routing (skew, locality, shared prefixes) they price an MoE model's steps at and the
    profiled side's idle start (fidelity.idle_start)."""
    meta = {**engine_meta(engine.info(), rc, outcome), "moe_routing_skew": moe.get("moe_routing_skew", 0.0),
            "idle_start": idle_start}
    if moe.get("moe_routing_locality"):  # absent at 0: the meta of runs without it stays as it was
        meta["moe_routing_locality"] = moe["moe_routing_locality"]
    if moe.get("moe_routing_shared_prefix"):
        meta.update({k: v for k, v in moe.items() if k.startswith("moe_routing_shared")})  # SharedRouting.meta
    return meta


def serve(engine, rc: RunConfig, fc: FidelityConfig, profile_path: str, progress: bool,
          record_sims: bool = False,
          moe: dict[str, float | bool | None] | None = None) -> tuple[list[RunOutcome], dict[str, RunOutcome]]:
    """The engine's runs (repeats) and each cost model's simulated run of one cell (and the
    carried model's, where one is given). record_sims: the simulated runs' steps carry their
    schedule hashes (the profiled model's point-estimate run; its interval draws never do)."""
    engine_runs, meta = [], None
    for i in range(fc.repeats):
        outcome = run_once(rc, progress, executor=engine, label=f"engine {rc.workload.name} #{i}", record=True)
        engine_runs.append(outcome)
        meta = meta or cell_meta(engine, rc, outcome, moe or {}, fc.idle_start)
    sims = {}
    for name in fc.cost_models:
        sim_rc = sim_run_config(rc, name, profile_path, meta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # extrapolation is what a held-out class is for
            if name == "profiled":
                sims[name] = simulate_with_interval(sim_rc, fc.interval, record=record_sims)
            else:
                sims[name] = run_once(sim_rc, False, label=f"sim {name}", record=record_sims)
    if fc.carried_profile_path is not None:
        carried_rc = sim_run_config(rc, "profiled", fc.carried_profile_path, meta)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sims["carried"] = run_once(carried_rc, False, label="sim carried", record=record_sims)
    return engine_runs, sims


def warm_up(engine, rc: RunConfig) -> None:
    """Serve the class offline once, unmeasured. A class's first run on an engine meets shapes
    no earlier run had (eager prefills of its lengths: new kernel specialisations, a larger
    allocation); on an H100 its eager prefills took 54 ms against 36 ms after
    (experiments/fidelity/h100_second_lease/loop_probe_shared_prefix.txt.gz), and the offline TTFT of
    the first class of a call spread 20-22% between its repeats (heldout.csv)."""
    run_once(rc, False, executor=engine, label=f"warm-up {rc.workload.name}", record=False)


def keep_steps(fc: FidelityConfig, rc: RunConfig, name: str, load: str, engine_runs: list[RunOutcome],
               profile_path: str, engine, sims: dict[str, RunOutcome],
               moe: dict[str, float | bool | None] | None = None) -> None:
    """The cell's per-step replays under fc.steps_dir (harness.fidelity.steps) and its requests'
    windows, engine runs and simulated runs side by side (harness.fidelity.windows); nothing
    without a steps_dir."""
    if fc.steps_dir is None:
        return
    from harness.fidelity.steps import expected_experts, predictors, write_replays, write_windows

    meta = cell_meta(engine, rc, engine_runs[0], moe or {})
    write_replays(Path(fc.steps_dir), name, load, [run.steps for run in engine_runs],
                  predictors(rc, fc.cost_models, profile_path, meta), expected_experts(rc, meta))
    runs = {f"engine {i}": (run.requests, run.steps) for i, run in enumerate(engine_runs)}
    runs.update({f"sim {cost_model}": (run.requests, run.steps) for cost_model, run in sims.items()})
    write_windows(Path(fc.steps_dir), name, load, runs)


def summaries(engine_runs: list[RunOutcome], sims: dict[str, RunOutcome], fc: FidelityConfig, rc: RunConfig,
              engine, profile_path: str, moe: dict[str, float | bool | None]) -> tuple[list[dict], dict[str, dict]]:
    """The engine runs' and simulated runs' summaries, and the profiled model's at the serving
    host's speed where fc.price_serving_host asks for it (harness.fidelity.serving_host)."""
    simulated = {name: run.summary for name, run in sims.items()}
    if fc.price_serving_host and "profiled" in fc.cost_models:
        from harness.fidelity.serving_host import serving_host_rows

        meta = cell_meta(engine, rc, engine_runs[0], moe or {}, fc.idle_start)
        simulated.update(serving_host_rows(rc, profile_path, meta, engine_runs, fc.interval))
    return [run.summary for run in engine_runs], simulated


def run_fidelity(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    fc = to_dataclass(FidelityConfig, section(cfg, "fidelity"), "fidelity")
    fc = dataclasses.replace(
        fc, profile_path=existing_path(fc.profile_path, "fidelity.profile_path"),
        carried_profile_path=existing_path(fc.carried_profile_path, "fidelity.carried_profile_path"))
    rc = build_run_config(cfg)
    if rc.backend != "engine":
        raise ConfigError(f"backend must be engine for the held-out protocol, got {rc.backend}")
    refuse_engine_without_gpu(rc, "fidelity", tiny_ok=False)
    if fc.idle_start and rc.hardware.idle_start_host_s is None:
        raise ConfigError(f"fidelity.idle_start=true: hardware {rc.hardware.name} has no idle_start_host_s; "
                          "use null (where measured) or false")
    rc = dataclasses.replace(rc, scheduler=dataclasses.replace(
        rc.scheduler, max_model_len=classes.max_model_len(rc.scheduler.max_model_len, fc.length_scale)))
    results = Path(fc.results_dir) if fc.results_dir else out_dir
    results.mkdir(parents=True, exist_ok=True)
    try:
        executor = make_executor(rc)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"backend=engine: {error}") from None
    rows, schedules = [], []
    try:
        profile_path, moe = calibrated_model(executor, rc, fc, out_dir)
        # one tick per cell (a class offline, then at each load), so the bar shows the whole run
        cells = tqdm(total=len(fc.workloads) * (1 + len(fc.loads)), desc="fidelity cells", unit="cell",
                     disable=not output.progress)
        for name in fc.workloads:
            base = classes.class_run_config(rc, name, fc.num_requests, fc.length_scale, fc.preempt_num_blocks)
            engine = PinnedBlocks(executor, base.cache.num_blocks)
            if fc.warmup:
                warm_up(engine, base)
            engine_runs, sims = serve(engine, base, fc, profile_path, False, record_sims=True, moe=moe)
            keep_steps(fc, base, name, "offline", engine_runs, profile_path, engine, sims, moe)
            schedules += schedule_rows(rc, name, [r.steps for r in engine_runs], {c: r.steps for c, r in sims.items()})
            engine_summaries, sim_summaries = summaries(engine_runs, sims, fc, base, engine, profile_path, moe)
            del engine_runs, sims  # per-step tables live for their cell only, not through the load cells
            capacity = float(np.mean([s["request_s"] for s in engine_summaries]))
            rows += cell_rows(rc, name, "offline", np.nan, engine_summaries, sim_summaries,
                              OFFLINE_METRICS + COUNTED_METRICS)
            _save(rows, schedules, results)
            cells.update(1)
            for load in fc.loads:
                cell = classes.with_rate(base, name, load * capacity)
                engine_runs, sims = serve(engine, cell, fc, profile_path, False, moe=moe)
                keep_steps(fc, cell, name, f"{load:g}", engine_runs, profile_path, engine, sims, moe)
                engine_summaries, sim_summaries = summaries(engine_runs, sims, fc, cell, engine, profile_path, moe)
                del engine_runs, sims
                rows += cell_rows(rc, name, f"{load:g}", load * capacity, engine_summaries, sim_summaries,
                                  LOAD_METRICS + COUNTED_METRICS)
                _save(rows, schedules, results)
                cells.update(1)
        cells.close()
    finally:
        executor.shutdown()
    table = _save(rows, schedules, results)
    plot_heldout(table, results / "heldout.png")
    return table


def _save(rows: list[dict], schedules: list[dict], results: Path) -> pd.DataFrame:
    """heldout.csv and schedules.csv of the cells served so far: a call cut short (a device's time
    limit, Ctrl-C) keeps every finished cell."""
    table = at_measured_host(pd.DataFrame(rows))
    table.to_csv(results / "heldout.csv", index=False)
    schedules_frame(schedules).to_csv(results / "schedules.csv", index=False)
    return table
