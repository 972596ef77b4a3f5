"""Calibrate the profiled cost model on the GPU, then compare the simulator with the engine on the
target workloads, with one loaded engine (the model is loaded and its graphs captured once).

  python experiments/calibration/calibrate_and_compare.py model=qwen3-0.6b hardware=h100 \
      calibrate.out=$OUT/qwen3_0_6b [backend.model=/tmp/q06] [poisson:workload.num_requests=400] [grid.num_random=20]

Every argument is a Hydra override of the harness's config (conf/, composed with
experiment=compare, as `python -m harness experiment=compare` takes them) and applies to every run,
except three kinds:
  STAGE:OVERRIDE      only for the runs of one stage: calibration, calibration_online, bench,
                      poisson, azure (STAGES below holds each stage's own overrides)
  grid.FIELD=VALUE    a field of the profile grid (harness.calibration.profiling.ProfileGrid)
  calibrate.FIELD=VALUE  a field of CalibrateConfig below (calibrate.out is required)

Stages, each written to calibrate.out as soon as it is done (no stage starts after
calibrate.deadline_s):
1. profile.csv: harness.calibration.profiling over the grid (rows "grid") and random shapes (rows "random");
2. calibration/: a real run of a calibration workload (bench lengths, seed 1, short outputs, so
   decode batches span 1..max_num_seqs), steps recorded with host times; then
   calibration_online/: a later window of the Azure conversation trace, which no target uses, so
   that the fit sees the small prefills and ragged decodes that arrivals make;
3. model.csv (executor time fitted on the grid, host time on the calibration steps) and
   validation.csv (held-out errors: grid split, random shapes, the calibration runs' steps);
4. compare_<workload>/: harness.compare.study against model.csv: bench (nano-vllm's, offline), poisson
   (bench lengths at calibrate.poisson_load of the engine's offline request throughput measured
   by the bench stage, unless poisson:workload.rate is given), azure (the Azure conversation trace);
5. meta.json: command, overrides, versions, stage times (calibration/recompare.py reads it).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from harness.calibration.fit import validate
from harness.calibration.profiling import ProfileGrid, profile_executor
from harness.compare.study import CompareConfig, compare
from harness.config import section
from harness.convert import to_dataclass
from harness.run import make_executor, run_once, write_outcome
from harness.scripting import compose_config, compose_run_config, one_line_errors
from harness.shared_executor import EagerSteps, KeepAlive

log = logging.getLogger("calibrate")
TARGETS = ("bench", "poisson", "azure")
STAGES = {
    "calibration": ["workload=bench", "workload.seed=1", "workload.num_requests=512", "workload.output_len.low=16",
                    "workload.output_len.high=128"],
    "calibration_online": ["workload=trace_azure_conv", "workload.start_row=10000", "workload.num_requests=600"],
    "bench": ["workload=bench", "workload.num_requests=256"],
    "poisson": ["workload=poisson", "workload.num_requests=512"],
    "azure": ["workload=trace_azure_conv", "workload.num_requests=600"],
}


@dataclass(frozen=True)
class CalibrateConfig:
    out: str
    grid: str = "full"  # the base profile grid: ProfileGrid() (full) or ProfileGrid.quick()
    workloads: tuple[str, ...] = TARGETS
    online_calibration: bool = True
    poisson_load: float = 0.7  # the poisson rate, as a fraction of the bench's request throughput
    eager_bench: bool = False  # also compare the bench with CUDA graphs bypassed (decode_eager regime)
    deadline_s: float = 450.0
    git_commit: str = "unknown"

    def __post_init__(self) -> None:
        if self.grid not in ("full", "quick"):
            raise ValueError(f"calibrate.grid must be full or quick, got {self.grid!r}")
        if not set(self.workloads) <= set(TARGETS):
            raise ValueError(f"calibrate.workloads must be a subset of {list(TARGETS)}, got {list(self.workloads)}")
        if not 0 < self.poisson_load <= 1:
            raise ValueError(f"calibrate.poisson_load must be in (0, 1], got {self.poisson_load}")


@dataclass(frozen=True)
class Plan:
    settings: CalibrateConfig
    grid: ProfileGrid
    base: list[str]  # Hydra overrides of every run
    stages: dict[str, list[str]]  # stage -> its own Hydra overrides


def parse(argv: list[str]) -> Plan:
    base, own, grid_items = [], [], []
    stages = {name: list(overrides) for name, overrides in STAGES.items()}
    for item in argv:
        stage, sep, rest = item.partition(":")
        if sep and "=" not in stage:
            if stage not in stages:
                raise ValueError(f"{item}: unknown stage {stage!r}; stages: {list(stages)}")
            stages[stage].append(rest)
        elif item.startswith("calibrate."):
            own.append(item.removeprefix("calibrate."))
        elif item.startswith("grid."):
            grid_items.append(item.removeprefix("grid."))
        else:
            base.append(item)
    settings = to_dataclass(CalibrateConfig, OmegaConf.to_container(OmegaConf.from_dotlist(own)), "calibrate")
    grid_base = dataclasses.asdict(ProfileGrid() if settings.grid == "full" else ProfileGrid.quick())
    grid_base.update(OmegaConf.to_container(OmegaConf.from_dotlist(grid_items)))
    grid = to_dataclass(ProfileGrid, grid_base, "grid")
    return Plan(settings, grid, ["experiment=compare", "output.progress=false", *base], stages)


class Stages:
    """Times each stage and records it in meta.json as soon as it is done."""

    def __init__(self, plan: Plan, out: Path) -> None:
        self.plan, self.out, self.started = plan, out, time.perf_counter()
        self.meta = {"command": " ".join(sys.argv), "git_commit": plan.settings.git_commit, "overrides": plan.base,
                     "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "python": platform.python_version(), "stages": {}}

    def time_left(self) -> bool:
        return time.perf_counter() - self.started < self.plan.settings.deadline_s

    def done(self, name: str, t0: float, **info) -> None:
        self.meta["stages"][name] = {"seconds": round(time.perf_counter() - t0, 1), **info}
        (self.out / "meta.json").write_text(json.dumps(self.meta, indent=1, default=str))
        log.info("stage %s done in %.1f s (%.0f s elapsed)", name, time.perf_counter() - t0,
                 time.perf_counter() - self.started)


def calibrate(plan: Plan, executor, shared, stages: Stages, sizes) -> pd.DataFrame:
    """Stages 1-3: profile, calibration runs, fit; returns the fitted model's validation table."""
    out = stages.out
    t0 = time.perf_counter()
    rc = compose_run_config(plan.base)
    profile = profile_executor(executor, rc.scheduler, plan.grid)
    profile.to_csv(out / "profile.csv", index=False)
    stages.done("profile", t0, rows=len(profile), grid=dataclasses.asdict(plan.grid))
    runs = ["calibration"] + (["calibration_online"] if plan.settings.online_calibration else [])
    steps = []
    for name in runs:
        t0 = time.perf_counter()
        outcome = run_once(compose_run_config(plan.base + plan.stages[name]), False, executor=shared, record=True)
        write_outcome(outcome, out / name, plots=False)
        steps.append(outcome.steps)
        stages.done(f"{name}_run", t0, overrides=plan.stages[name], steps=len(outcome.steps))
    t0 = time.perf_counter()
    model, validation = validate(profile, pd.concat(steps, ignore_index=True), sizes)
    model.to_csv(out / "model.csv")
    validation.to_csv(out / "validation.csv", index=False)
    stages.done("fit", t0)
    return validation


def compare_targets(plan: Plan, executor, shared, stages: Stages) -> None:
    """Stage 4: each target workload, engine against simulator with the fitted model."""
    cc = dataclasses.replace(to_dataclass(CompareConfig, section(compose_config(plan.base), "compare"), "compare"),
                             profile_path=str(stages.out / "model.csv"))
    bench_request_s = None
    runs = [(name, name, shared) for name in plan.settings.workloads]
    if plan.settings.eager_bench and "bench" in plan.settings.workloads:
        runs.append(("bench_eager", "bench", EagerSteps(executor)))  # the simulator then prices decodes as eager too
    for folder, name, runner in runs:
        extra = list(plan.stages[name])
        if name == "poisson" and not any(o.startswith("workload.rate=") for o in extra):
            if bench_request_s is None:
                log.warning("poisson needs the bench's throughput first (or poisson:workload.rate=...): skipped")
                continue
            extra.append(f"workload.rate={plan.settings.poisson_load * bench_request_s:.4f}")
        if not stages.time_left():
            log.warning("deadline: skipping %s", folder)
            continue
        t0 = time.perf_counter()
        rc = compose_run_config(plan.base + extra)
        result = compare(rc, cc, stages.out / f"compare_{folder}", executor=runner)
        if folder == "bench":
            bench_request_s = float(result.table.set_index("metric").loc["request_s", "engine"])
        print(result.report, flush=True)
        stages.done(f"compare_{folder}", t0, overrides=extra)


def run(plan: Plan) -> int:
    out = Path(plan.settings.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(plan, out)
    t0 = time.perf_counter()
    rc = compose_run_config(plan.base)
    executor = make_executor(rc)
    info = executor.info()
    sizes = info.graph_sizes
    import torch

    stages.meta.update(torch=torch.__version__, device=info.device, num_blocks=info.num_blocks,
                       graph_batch_sizes=list(sizes.decode), prefill_graph_sizes=list(sizes.prefill),
                       engine_config=dataclasses.asdict(rc.engine), scheduler=dataclasses.asdict(rc.scheduler))
    stages.done("load", t0)
    shared = KeepAlive(executor)
    try:
        validation = calibrate(plan, executor, shared, stages, sizes)
        print(validation.to_string(index=False, float_format=lambda v: f"{v:.4f}"), flush=True)
        compare_targets(plan, executor, shared, stages)
    finally:
        executor.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    return one_line_errors(lambda: run(parse(args)))


if __name__ == "__main__":
    sys.exit(main())
