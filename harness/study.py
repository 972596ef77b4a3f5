"""What one `python -m harness` invocation does with its config: a run, a sweep, a capacity search
or the bench, writing everything into out_dir (Hydra's run directory)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from harness.config import build_run_config, build_study, section
from harness.convert import ConfigError
from harness.fleet_config import build_fleet
from harness.report import format_summary, format_table
from harness.run import require_served, run_once, write_outcome


def run_study(cfg: DictConfig, out_dir: Path) -> pd.DataFrame:
    """Run what cfg.study asks for; returns its table (one summary row per run or configuration)."""
    study, output = build_study(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    if study.kind == "sweep":
        from harness.sweep import run_sweep

        table = run_sweep(cfg, study, output, out_dir)
        print(format_table(table, ["value"]))
        print(f"outputs: {out_dir} (sweep.csv, sweep.png)")
        return table
    if study.kind == "capacity":
        from harness.capacity import run_capacity

        table = run_capacity(cfg, study, output, out_dir)
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"outputs: {out_dir} (capacity.csv, capacity_probes.csv, capacity.png)")
        return table
    if study.kind == "compare":
        from harness.compare import run_compare

        table = run_compare(cfg, study, output, out_dir)
        print(f"outputs: {out_dir} (compare.csv, compare.md, compare_*.csv, compare_*.png, engine/, sim_*/)")
        return table
    if study.kind == "fidelity":
        from harness.fidelity import run_fidelity

        table = run_fidelity(cfg, study, output, out_dir)
        print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print(f"outputs: {out_dir} (heldout.csv, schedules.csv, heldout.png; fidelity.results_dir if set)")
        return table
    if study.kind == "plan":
        from harness.plan import run_plan

        return run_plan(cfg, output, out_dir)
    rc = build_run_config(cfg)
    fleet, router = build_fleet(cfg)
    interval = cfg.get("interval")
    if not fleet.is_single_run:
        if interval is not None:
            raise ConfigError("interval: prediction intervals are computed for a single run, not a fleet "
                              f"(fleet.replicas={fleet.replicas}); set interval=null")
        from harness.fleet import run_fleet_study

        return run_fleet_study(rc, fleet, router, output, out_dir)
    if interval is not None:
        # a simulated run with P50/P90 prediction intervals in summary.csv (<metric>_lo/_hi)
        from harness.convert import to_dataclass
        from harness.fidelity_interval import simulate_with_interval
        from sim.interval import IntervalConfig

        outcome = simulate_with_interval(rc, to_dataclass(IntervalConfig, section(cfg, "interval"), "interval"),
                                         progress=output.progress)
    else:
        outcome = run_once(rc, output.progress)
    write_outcome(outcome, out_dir, output.plots, output.steps)
    require_served(outcome)
    print(format_summary(outcome.summary))
    if study.kind == "bench":
        print(bench_line(outcome.summary))
    print(f"outputs: {out_dir}")
    return pd.DataFrame([outcome.summary])


def bench_line(row: dict) -> str:
    """nano-vllm's bench figure: generated tokens over the time to serve the whole batch."""
    clock = "simulated" if row["backend"] == "sim" else "wall"
    return (f"bench: {row['output_tokens']} output tokens in {row['makespan_s']:.2f} s ({clock} time): "
            f"{row['output_tok_s']:.2f} tok/s")
