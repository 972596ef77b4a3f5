"""The engine side of a comparison (harness.compare.study): run the engine with every step recorded
(profiling its executor first where no profile is given), or read a saved run from
compare.engine_dir, checked against the workload and scheduler of this one."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from engine.core import BackendInfo
from harness.config import RunConfig
from harness.convert import ConfigError
from harness.run import RunOutcome, make_executor, run_once, write_outcome
from sim.profiled import ExtrapolationWarning

if TYPE_CHECKING:
    from harness.compare.study import CompareConfig


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


def engine_meta(info: BackendInfo, rc: RunConfig, outcome: RunOutcome) -> dict:
    return {"num_blocks": outcome.num_blocks, "graph_batch_sizes": list(outcome.graph_sizes.decode),
            "prefill_graph_sizes": list(outcome.graph_sizes.prefill),
            "decode_graph_context": outcome.graph_sizes.decode_context, "device": info.device,
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
