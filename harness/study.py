"""What one `python -m harness` invocation does with its config: the study that study.kind names
(one run, a sweep, a capacity search, the bench, a comparison, a fidelity study, a plan), writing
everything into out_dir (Hydra's run directory).

Studies live in STUDIES by kind. A study is a function (cfg, study, output, out_dir) -> table that
prints its table and an `outputs:` line naming what it wrote; adding one is one function here
that imports its module and calls it, so the heavy studies load only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
from omegaconf import DictConfig

from engine.core.registry import Registry
from harness.config import CapacityConfig, OutputConfig, build_run_config, section
from harness.convert import ConfigError, to_dataclass
from harness.fleet.config import build_fleet, check_router_read, in_node
from harness.fleet.disagg_config import build_disagg, is_disaggregated
from harness.report import format_summary, format_table
from harness.run import require_served, run_once, write_outcome
from sim.interval import IntervalConfig


class Study(Protocol):
    def __call__(self, cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
        """Run the study into out_dir, print its table and outputs line, return the table."""


STUDIES: Registry[Study] = Registry("study.kind")
INTERVAL_STUDIES = ("single", "bench")  # the studies that read the top-level interval section


@dataclass(frozen=True)
class StudyConfig:
    """kind: a name in STUDIES: single (one run), sweep (one run per value of `param`), capacity
    (a rate search per value of `param`, or once when param is null), bench (one run, printed like
    nano-vllm's bench), compare (engine vs simulator on one workload: harness.compare.study, settings in
    the compare section), fidelity (harness.fidelity.study), plan (deployment search: harness.plan.search).
    param is a dotted config key (scheduler.max_num_batched_tokens) or a group name (hardware).
    """

    name: str = "run"
    kind: str = "single"
    param: str | None = None
    values: tuple[Any, ...] = ()
    metrics: tuple[str, ...] = ("output_tok_s", "ttft_p90_s", "tpot_p90_s", "preemptions")
    log_x: bool = False
    capacity: CapacityConfig | None = None

    def __post_init__(self) -> None:
        STUDIES.check(self.kind)
        if self.kind == "sweep" and (not self.param or not self.values):
            raise ValueError("study.param and study.values must be set for a sweep (values: a non-empty list)")
        if self.param and not self.values:
            raise ValueError(f"study.values must list the values of study.param={self.param!r}")
        if self.param and self.kind not in ("sweep", "capacity"):
            raise ValueError(f"study.param is only used by study.kind=sweep or capacity, got kind={self.kind!r}")
        if self.kind == "capacity" and self.capacity is None:
            raise ValueError("study.capacity must be set (SLOs and search range) when study.kind=capacity")


def build_study(cfg: DictConfig) -> tuple[StudyConfig, OutputConfig]:
    return (
        to_dataclass(StudyConfig, section(cfg, "study"), "study"),
        to_dataclass(OutputConfig, section(cfg, "output"), "output"),
    )


def run_study(cfg: DictConfig, out_dir: Path) -> pd.DataFrame:
    """Run what cfg.study asks for; returns its table (one summary row per run or configuration)."""
    study, output = build_study(cfg)
    if cfg.get("interval") is not None and study.kind not in INTERVAL_STUDIES:
        instead = " (a comparison's profiled run takes compare.interval)" if study.kind == "compare" else ""
        raise ConfigError(f"interval: prediction intervals are computed by study.kind={' or '.join(INTERVAL_STUDIES)} "
                          f"(one run or fleet), not {study.kind}; set interval=null{instead}")
    out_dir.mkdir(parents=True, exist_ok=True)
    return STUDIES.get(study.kind)(cfg, study, output, out_dir)


def _serve_disaggregated(cfg: DictConfig, rc, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    """fleet=disaggregated: pools of fixed size, or each scaled on its own (fleet.<pool>.autoscale)."""
    from harness.autoscale.config import build_autoscale

    _, router = build_fleet(cfg, with_fleet=False)
    fleet = build_disagg(cfg)
    pool_routers = (fleet.prefill_router, fleet.decode_router)
    check_router_read(router, [name or router.name for name in pool_routers],
                      f"fleet=disaggregated (fleet.prefill_router={fleet.prefill_router}, "
                      f"fleet.decode_router={fleet.decode_router})",
                      "a pool without a router of its own (fleet.prefill_router or fleet.decode_router null)"
                      if None not in pool_routers else None)
    autoscale, slo = build_autoscale(cfg)
    if autoscale.policy is not None:
        raise ConfigError(f"autoscale.policy={autoscale.policy}: with fleet=disaggregated each pool scales on its own; "
                          f"set fleet.prefill.autoscale='{{policy: {autoscale.policy}}}' and/or fleet.decode.autoscale")
    if fleet.prefill.autoscale or fleet.decode.autoscale:
        from harness.autoscale.disagg import run_disagg_autoscale_study

        if cfg.get("interval") is not None:
            raise ConfigError("interval: prediction intervals are computed for a fixed fleet, not autoscaled pools; "
                              "set interval=null")
        return run_disagg_autoscale_study(rc, fleet, router, autoscale, slo, output, out_dir)
    from harness.fleet.disagg import run_disagg_study

    return run_disagg_study(rc, fleet, router, output, out_dir, _interval(cfg))


def _serve_workload(cfg: DictConfig, output: OutputConfig, out_dir: Path, bench: bool) -> pd.DataFrame:
    """One run (or one fleet) of the configured workload; bench: print nano-vllm's bench line too."""
    rc = build_run_config(cfg)
    if is_disaggregated(cfg):
        return _serve_disaggregated(cfg, rc, output, out_dir)
    fleet, router = build_fleet(cfg)
    interval = _interval(cfg)
    autoscaled = cfg.get("autoscale") is not None and cfg.autoscale.get("policy") is not None
    routed = autoscaled or fleet.replicas > 1
    check_router_read(router, [router.name] if routed else [],
                      f"router.name={router.name}" if routed else "a single replica (fleet.replicas=1)")
    if autoscaled:
        from harness.autoscale.config import build_autoscale
        from harness.autoscale.run import run_autoscale_study

        if interval is not None:
            raise ConfigError("interval: prediction intervals are computed for a fixed fleet, not an autoscaled "
                              "one; set interval=null")
        autoscale, slo = build_autoscale(cfg)
        return run_autoscale_study(rc, fleet, router, autoscale, slo, output, out_dir)
    if cfg.get("autoscale") is not None:
        from harness.autoscale.config import build_autoscale

        build_autoscale(cfg)[0].check_static("autoscale")  # no policy: a static fleet reads no autoscale setting
    if not fleet.is_single_run:
        from harness.fleet.run import run_fleet_study

        return run_fleet_study(rc, fleet, router, output, out_dir, interval)
    if rc.backend == "sim":  # an engine's ranks are the machine's own GPUs; a compare's CPU side may run TP 2
        in_node(rc, "execution.tensor_parallel_size")
    if interval is not None:
        # a simulated run with P50/P90 prediction intervals in summary.csv (<metric>_lo/_hi)
        from harness.fidelity.interval import simulate_with_interval

        outcome = simulate_with_interval(rc, interval, progress=output.progress)
    else:
        outcome = run_once(rc, output.progress, keep_steps=output.steps != "none" or output.plots)
    write_outcome(outcome, out_dir, output.plots, output.steps)
    require_served(outcome)
    print(format_summary(outcome.summary))
    if bench:
        print(bench_line(outcome.summary))
    print(f"outputs: {out_dir}")
    return pd.DataFrame([outcome.summary.to_row()])


def _interval(cfg: DictConfig) -> IntervalConfig | None:
    """The interval section as an IntervalConfig; None where it is null."""
    if cfg.get("interval") is None:
        return None
    return to_dataclass(IntervalConfig, section(cfg, "interval"), "interval")


def bench_line(row: dict) -> str:
    """nano-vllm's bench figure: generated tokens over the time to serve the whole batch."""
    clock = "simulated" if row["backend"] == "sim" else "wall"
    return (f"bench: {row['output_tokens']} output tokens in {row['makespan_s']:.2f} s ({clock} time): "
            f"{row['output_tok_s']:.2f} tok/s")


@STUDIES.register("single")
def _single(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    return _serve_workload(cfg, output, out_dir, bench=False)


@STUDIES.register("sweep")
def _sweep(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.sweeps.sweep import run_sweep

    table = run_sweep(cfg, study, output, out_dir)
    print(format_table(table, ["value"]))
    print(f"outputs: {out_dir} (sweep.csv, sweep.png)")
    return table


@STUDIES.register("capacity")
def _capacity(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.sweeps.capacity import run_capacity

    table = run_capacity(cfg, study, output, out_dir)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"outputs: {out_dir} (capacity.csv, capacity_probes.csv, capacity.png)")
    return table


@STUDIES.register("bench")
def _bench(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    return _serve_workload(cfg, output, out_dir, bench=True)


@STUDIES.register("compare")
def _compare(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.compare.study import run_compare

    table = run_compare(cfg, study, output, out_dir)
    print(f"outputs: {out_dir} (compare.csv, compare.md, compare_*.csv, compare_*.png, engine/, sim_*/)")
    return table


@STUDIES.register("fidelity")
def _fidelity(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.fidelity.study import run_fidelity

    table = run_fidelity(cfg, study, output, out_dir)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"outputs: {out_dir} (heldout.csv, schedules.csv, heldout.png; fidelity.results_dir if set)")
    return table


@STUDIES.register("autoscale")
def _autoscale(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.autoscale.study import run_autoscale_experiment

    return run_autoscale_experiment(cfg, output, out_dir)  # prints its own table and outputs line


@STUDIES.register("plan")
def _plan(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.plan.run import run_plan

    return run_plan(cfg, output, out_dir)  # prints its own table and outputs line
