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
import json
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from omegaconf import DictConfig

from engine.core import BackendInfo, ExecutionConfig, GraphSizes
from harness.compare import tables
from harness.config import OutputConfig, RunConfig, build_run_config, existing_path, section
from harness.convert import ConfigError, to_dataclass
from harness.run import RunOutcome, make_executor, run_once, write_outcome
from sim.cost_model import COST_MODELS
from sim.interval import IntervalConfig
from sim.profiled import ExtrapolationWarning

if TYPE_CHECKING:
    from harness.study import StudyConfig

log = logging.getLogger(__name__)
GRIDS = ("quick", "full")


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


@dataclass(frozen=True, eq=False)  # tables do not compare
class Side:
    """One run of the comparison: the engine, or sim_<cost model>."""

    name: str
    requests: pd.DataFrame
    steps: pd.DataFrame
    # a RunSummary, or the engine's summary.csv row where it was loaded from compare.engine_dir
    summary: Mapping[str, Any]
    has_interval: bool = False  # the summary carries <metric>_lo/_hi (sim.interval)


@dataclass(frozen=True, eq=False)
class EngineSide(Side):
    meta: dict = field(default_factory=dict)  # num_blocks, graph_batch_sizes, prefill_graph_sizes, device, ...


@dataclass
class CompareResult:
    table: pd.DataFrame
    schedule: pd.DataFrame
    replayed: pd.DataFrame
    targets: pd.DataFrame
    report: str


def engine_meta(info: BackendInfo, rc: RunConfig, outcome: RunOutcome) -> dict:
    return {"num_blocks": outcome.num_blocks, "graph_batch_sizes": list(outcome.graph_sizes.decode),
            "prefill_graph_sizes": list(outcome.graph_sizes.prefill), "device": info.device,
            "async_scheduling": info.overlaps_steps, "all_reduce": info.all_reduce,
            "engine_config": dataclasses.asdict(rc.engine)}


def run_engine_side(rc: RunConfig, cc: CompareConfig, out_dir: Path, progress: bool, plots: bool,
                    executor=None) -> tuple[EngineSide, str | None]:
    """Run (or load) the engine; returns it and the profile path to use (fitted inline if needed)."""
    if cc.engine_dir:
        from harness.calibration.fit import with_seeded_rows

        folder = Path(cc.engine_dir)
        if not (folder / "engine.json").is_file():
            raise ConfigError(f"compare.engine_dir: {folder} has no engine.json "
                              "(expected a comparison's engine/ folder)")
        meta = json.loads((folder / "engine.json").read_text())
        for name in ("workload", "scheduler"):
            config = getattr(rc, name)
            ours = json.loads(json.dumps(dataclasses.asdict(config)))
            # a field the saved run predates had its default there
            defaults = json.loads(json.dumps({f.name: f.default for f in dataclasses.fields(config)
                                              if f.default is not dataclasses.MISSING}))
            saved = {**defaults, **meta.get(name, {})}
            if name in meta and saved != ours:
                differ = sorted(k for k in ours if ours[k] != saved.get(k))
                raise ConfigError(f"compare.engine_dir: the saved engine run had another {name} config "
                                  f"({', '.join(f'{name}.{k}={saved.get(k)!r}' for k in differ)}); "
                                  "pass the same overrides")
        from harness.output.metrics import read_steps

        try:
            steps = with_seeded_rows(read_steps(folder), meta["workload"]["temperature"])
        except FileNotFoundError as error:
            raise ConfigError(f"compare.engine_dir: {error}") from None
        side = EngineSide("engine", pd.read_csv(folder / "requests.csv"), steps,
                          pd.read_csv(folder / "summary.csv").iloc[0].to_dict(), meta=meta)
        return side, cc.profile_path
    if rc.backend != "engine":
        raise ConfigError(f"backend must be engine for a comparison (or set compare.engine_dir), got {rc.backend}")
    if executor is None:
        try:
            executor = make_executor(rc)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"backend=engine: {error}") from None
    profile_path = cc.profile_path
    try:
        if profile_path is None and "profiled" in cc.cost_models:
            profile_path = str(profile_inline(executor, rc, cc, out_dir))
        outcome = run_once(rc, progress, executor=executor, label="engine", record=True)
    except BaseException:
        executor.shutdown()
        raise
    meta = engine_meta(executor.info(), rc, outcome)
    meta.update(workload=dataclasses.asdict(rc.workload), scheduler=dataclasses.asdict(rc.scheduler),
                cache=dataclasses.asdict(rc.cache))
    write_outcome(outcome, out_dir / "engine", plots)
    (out_dir / "engine" / "engine.json").write_text(json.dumps(meta, indent=1, default=str))
    return EngineSide("engine", outcome.requests, outcome.steps, outcome.summary, meta=meta), profile_path


def profile_inline(executor, rc: RunConfig, cc: CompareConfig, out_dir: Path) -> Path:
    from harness.calibration.fit import validate
    from harness.calibration.profiling import ProfileGrid, profile_executor

    sizes = executor.info().graph_sizes
    grid = ProfileGrid.quick() if cc.grid == "quick" else ProfileGrid()
    profile = profile_executor(executor, rc.scheduler, grid)
    out_dir.mkdir(parents=True, exist_ok=True)
    profile.to_csv(out_dir / "profile.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)  # held-out rows outside a partial fit
        model, _ = validate(profile, None, sizes)  # the fit, with held-out residuals for compare.interval
    model.to_csv(out_dir / "profile_model.csv")
    return out_dir / "profile_model.csv"


def engine_graph_sizes(meta: dict) -> GraphSizes:
    """The CUDA graphs a saved engine run replayed (runs saved before prefill graphs had none)."""
    return GraphSizes(tuple(meta["graph_batch_sizes"]), tuple(meta.get("prefill_graph_sizes", ())))


def describe(graphs: GraphSizes) -> str:
    if not graphs:
        return "none (eager)"
    decode = f"decode up to {graphs.decode[-1]} sequences" if graphs.decode else "no decode"
    return decode + (f", prefill up to {graphs.prefill[-1]} tokens" if graphs.prefill else ", prefill eager")


def engine_execution(meta: dict) -> ExecutionConfig:
    """The execution settings under which the simulator replays a saved engine run: the graphs
    the engine captured (engine.core.graph_sizes maps them back to the settings exactly), its
    overlap (runs saved before async scheduling ran their steps one at a time), its TP size and
    its all-reduce as it was set up ("auto" resolved; runs saved before that setting existed ran
    NCCL's)."""
    graphs = engine_graph_sizes(meta)
    engine_config = meta.get("engine_config") or {}
    execution = engine_config.get("execution") or engine_config
    return ExecutionConfig(enforce_eager=not graphs, async_scheduling=bool(meta.get("async_scheduling", False)),
                           prefill_graph_tokens=max(graphs.prefill, default=0),
                           max_graph_batch_size=max(graphs.decode, default=ExecutionConfig.max_graph_batch_size),
                           tensor_parallel_size=execution.get("tensor_parallel_size", 1),
                           all_reduce=meta.get("all_reduce") or execution.get("all_reduce", "nccl"))


def sim_run_config(rc: RunConfig, cost_model: str, profile_path: str | None, meta: dict) -> RunConfig:
    from sim.config import SimConfig

    # an MoE model's routing skew, where the engine side measured one (harness.fidelity.routing)
    sim = SimConfig(cost_model=cost_model, profile_path=profile_path if cost_model == "profiled" else None,
                    execution=engine_execution(meta), moe_routing_skew=float(meta.get("moe_routing_skew", 0.0)))
    cache = dataclasses.replace(rc.cache, num_blocks=int(meta["num_blocks"]))
    return dataclasses.replace(rc, backend="sim", sim=sim, engine=None, cache=cache)


def step_pricer(sim_rc: RunConfig, meta: dict):
    """The cost model a simulated run of sim_rc prices steps with, on the engine's CUDA graphs."""
    from sim.cost_model import make_cost_model

    return make_cost_model(sim_rc.model, sim_rc.hardware, sim_rc.sim, engine_graph_sizes(meta))


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
