"""`python -m harness experiment=compare`: one workload served by the engine and by the simulator
with the same KV block count, and how far the simulation is from the measurement.

The engine runs first (it sizes its KV cache; every step is recorded with its features, schedule
fingerprint and host time), then the simulator once per cost model with cache.num_blocks and the
CUDA-graph sizes the engine had. The profiled model's calibration is compare.profile_path (saved
coefficients or a step-timing table, e.g. under experiments/calibration/), or, when null, a quick
profile of the engine's own executor taken just before the run (harness.calibration.profiling). With
compare.engine_dir the engine side is read from a saved run (a previous comparison's engine/
folder) instead: the simulation side and the report need no GPU.

Outputs in the run directory: engine/ and sim_<cost model>/ (each run's requests.csv, steps.csv.gz,
summary.csv, plots); compare.csv (metrics x runs, relative errors, replay rows);
compare_schedule.csv; compare_steps.csv (the replay: each engine step measured vs predicted);
compare_targets.csv; compare.md (all of it as text); compare_metrics.png, compare_steps.png,
compare_latency.png; profile.csv and profile_model.csv when profiled inline.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from omegaconf import DictConfig

from harness.compare import tables
from harness.compare.replay_config import describe, engine_execution, engine_graph_sizes, sim_run_config, step_pricer
from harness.compare.sides import EngineSide, Side, engine_meta, profile_inline, run_engine_side
from harness.config import OutputConfig, RunConfig, build_run_config, existing_path, section
from harness.convert import ConfigError, to_dataclass
from harness.run import run_once, write_outcome
from sim.cost_model import COST_MODELS
from sim.interval import IntervalConfig

if TYPE_CHECKING:
    from harness.study import StudyConfig

log = logging.getLogger(__name__)
GRIDS = ("quick", "full")
# the sides and the replay settings live in their own modules; re-exported here, where the studies
# and experiments import them from
__all__ = ["GRIDS", "CompareConfig", "CompareResult", "EngineSide", "Side", "compare", "describe",
           "engine_execution", "engine_graph_sizes", "engine_meta", "profile_inline", "refuse_engine_without_gpu",
           "run_compare", "run_engine_side", "sim_run_config", "step_pricer"]


@dataclass(frozen=True)
class CompareConfig:
    cost_models: tuple[str, ...] = COST_MODELS.names()
    profile_path: str | None = None  # null: profile the engine first (grid below) and fit on that
    grid: str = "quick"  # inline profile: quick (seconds) or full (harness.calibration.profiling.ProfileGrid())
    engine_dir: str | None = None  # a saved engine run to compare against, instead of running the engine
    throughput_tol: float = 0.05
    latency_tol: float = 0.10
    interval: IntervalConfig | None = None  # the profiled run's prediction interval (sim.interval); null: none

    def __post_init__(self) -> None:
        bad = [c for c in self.cost_models if c not in COST_MODELS]
        if bad or not self.cost_models:
            raise ValueError(f"compare.cost_models must be a non-empty subset of {list(COST_MODELS.names())}, "
                             f"got {self.cost_models}")
        if self.grid not in GRIDS:
            raise ValueError(f"compare.grid must be one of {GRIDS}, got {self.grid!r}")
        if self.engine_dir and not self.profile_path and "profiled" in self.cost_models:
            raise ValueError("compare.profile_path must be set with compare.engine_dir (no engine to profile)")
        for name in ("throughput_tol", "latency_tol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"compare.{name} must be > 0, got {getattr(self, name)}")


@dataclass
class CompareResult:
    table: pd.DataFrame
    schedule: pd.DataFrame
    replayed: pd.DataFrame
    targets: pd.DataFrame
    report: str


def compare(rc: RunConfig, cc: CompareConfig, out_dir: Path, progress: bool = False, plots: bool = True,
            executor=None) -> CompareResult:
    # Paths are checked before the engine runs for minutes, not when the simulator needs them.
    cc = dataclasses.replace(cc, profile_path=existing_path(cc.profile_path, "compare.profile_path"),
                             engine_dir=existing_path(cc.engine_dir, "compare.engine_dir"))
    out_dir.mkdir(parents=True, exist_ok=True)
    engine, profile_path = run_engine_side(rc, cc, out_dir, progress, plots, executor)
    sims: list[Side] = []
    predictors = {}
    for name in cc.cost_models:
        sim_rc = sim_run_config(rc, name, profile_path, engine.meta)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if name == "profiled" and cc.interval is not None:
                from harness.fidelity.interval import simulate_with_interval

                outcome = simulate_with_interval(sim_rc, cc.interval, progress=progress, record=True)
            else:
                outcome = run_once(sim_rc, progress, label=f"sim {name}", record=True)
            predictors[name] = step_pricer(sim_rc, engine.meta)
        for w in caught:
            log.warning("sim %s: %s", name, w.message)
        write_outcome(outcome, out_dir / f"sim_{name}", plots)
        sims.append(Side(f"sim_{name}", outcome.requests, outcome.steps, outcome.summary,
                         has_interval=name == "profiled" and cc.interval is not None))
    sides = [engine, *sims]
    table = tables.metrics_table({side.name: side.summary for side in sides})
    table = tables.interval_columns(table, {side.name: side.summary for side in sims if side.has_interval})
    schedule = tables.schedule_table(engine.steps, {side.name: side.steps for side in sims})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sims already reported extrapolation
        replayed = tables.replay(engine.steps, predictors)
    table = pd.concat([table, pd.DataFrame(tables.replay_rows(replayed, list(cc.cost_models)))], ignore_index=True)
    offline = rc.workload.arrival == "offline"
    targets = tables.targets(table, schedule, offline, cc.throughput_tol, cc.latency_tol)
    report = format_report(rc, engine, profile_path, offline, table, schedule, targets)
    table.to_csv(out_dir / "compare.csv", index=False)
    schedule.to_csv(out_dir / "compare_schedule.csv", index=False)
    replayed.to_csv(out_dir / "compare_steps.csv", index=False)
    targets.to_csv(out_dir / "compare_targets.csv", index=False)
    (out_dir / "compare.md").write_text(report)
    if plots:
        from harness.compare import plots as compare_plots
        from harness.labels import run_title
        from harness.output.plots import plot_latency_cdfs

        runs = [side.name for side in sides]
        title = run_title({**engine.summary, "hardware": engine.meta.get("device", "measured")})
        compare_plots.plot_metrics(table, runs, out_dir / "compare_metrics.png", title)
        compare_plots.plot_steps(replayed, list(cc.cost_models), out_dir / "compare_steps.png", title)
        plot_latency_cdfs({side.name: side.requests for side in sides}, out_dir / "compare_latency.png", title)
    return CompareResult(table, schedule, replayed, targets, report)


def format_report(rc: RunConfig, engine: EngineSide, profile_path, offline: bool, table: pd.DataFrame,
                  schedule: pd.DataFrame, targets: pd.DataFrame) -> str:
    meta = engine.meta
    graphs = engine_graph_sizes(meta)
    lines = [f"# Simulated vs measured: {rc.workload.label} ({'offline' if offline else rc.workload.arrival} arrivals)",
             "", f"- engine: {engine.summary.get('model', '?')} on {meta.get('device', '?')}, "
                 f"{meta['num_blocks']} KV blocks of {rc.cache.block_size} tokens, CUDA graphs: {describe(graphs)}",
             f"- simulator: model {rc.model.name}, hardware {rc.hardware.name}, same block count; profiled "
             f"calibration {profile_path}",
             f"- scheduler: {rc.scheduler.policy}, max_num_seqs {rc.scheduler.max_num_seqs}, "
             f"max_num_batched_tokens {rc.scheduler.max_num_batched_tokens}", "", "## Schedules", ""]
    for _, row in schedule.iterrows():
        if row["schedule_identical"]:
            lines.append(f"- {row['run']}: schedule_identical: True ({row['engine_steps']} steps, step by step)")
        else:
            lines.append(f"- {row['run']}: schedule_identical: False; first divergent step "
                         f"{row['first_divergent_step']} "
                         f"(engine t={row['engine_time_at_divergence_s']:.3f} s, sim t="
                         f"{row['sim_time_at_divergence_s']:.3f} s); {row['identical_steps']} of "
                         f"{row['engine_steps']} engine steps identical ({row['sim_steps']} sim steps)")
    if offline and not schedule["schedule_identical"].all():
        lines.append("- WARNING: offline schedules should be identical; the difference is a bug to report")
    lines += ["", "## Metrics (err = (sim - engine) / engine)", "", tables.markdown(table), "",
              "## Targets", "", tables.markdown(targets), ""]
    return "\n".join(lines)


def refuse_engine_without_gpu(rc: RunConfig, study: str, tiny_ok: bool) -> None:
    """A ConfigError for an engine study meant for a GPU on a machine without one (it would write a
    GB-sized checkpoint and run for hours), unless backend.device=cpu asks for the CPU explicitly
    or, with tiny_ok, the model is one of the tiny test models."""
    if rc.backend != "engine" or rc.engine.device != "auto" or (tiny_ok and rc.model.name.startswith("tiny")):
        return
    import torch

    if torch.cuda.is_available():
        return
    advice = (f"with the CPU settings of conf/experiment/{study}.yaml" if rc.model.name.startswith("tiny") else
              f"with a tiny model (model=tiny-qwen3 hardware=cpu, as conf/experiment/{study}.yaml shows); "
              f"{rc.model.name} would take hours")
    raise ConfigError(f"experiment={study} is meant for a GPU and this machine has none: to run it on the CPU, "
                      f"set backend.device=cpu, {advice}")


def run_compare(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    cc = to_dataclass(CompareConfig, section(cfg, "compare"), "compare")
    if output.steps != "full":
        raise ConfigError(f"output.steps={output.steps} does not apply to study.kind=compare: the replay and "
                          "compare.engine_dir read each run's step table (use output.steps=full)")
    rc = build_run_config(cfg)
    if cc.engine_dir is None:  # a saved engine run needs no engine
        refuse_engine_without_gpu(rc, "compare", tiny_ok=True)
    result = compare(rc, cc, out_dir, output.progress, output.plots)
    print(result.report)
    return result.table
