"""experiment=autoscale: the cheapest static fleet that meets the SLO over the whole workload,
beside each autoscaling policy with its thresholds searched over a small grid, and the SLO
attainment the best policy loses to cold starts of several lengths.

Outputs: autoscale.csv (every run: static fleets by replica count, each policy's settings),
autoscale_cost.png (cost against SLO attainment), cold_start.csv (the best policy at each start-up
time of autoscale_study.cold_starts_s, and with none), best/ (the best policy's run: its timeline,
tables and autoscale.png).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig

from engine.core.elastic import ColdStart
from harness.autoscale.config import SLO, AutoscaleConfig, build_autoscale
from harness.autoscale.policies import AUTOSCALE_POLICIES
from harness.autoscale.run import AutoscaleOutcome, run_autoscaled, write_autoscale_outcome
from harness.autoscale.timeline import TIMELINE_STEP_COLUMNS
from harness.config import OutputConfig, build_run_config, section
from harness.convert import ConfigError, to_dataclass
from harness.fleet.config import build_fleet
from harness.run import require_served

COLUMNS = ("kind", "policy", "settings", "replicas", "gpu_hours", "cost", "mean_replicas", "slo_attainment",
           "slo_met", "ttft_p90_s", "tpot_p90_s", "scale_ups", "scale_downs", "cold_start_s")


@dataclass(frozen=True)
class AutoscaleStudyConfig:
    """grids: per policy, autoscale fields and the values each takes (every combination is one run);
    cold_starts_s: start-up times (s) the best policy is rerun at (and at 0) to price cold starts."""

    grids: dict[str, dict[str, tuple[Any, ...]]] = field(default_factory=dict)
    cold_starts_s: tuple[float, ...] = (30.0, 120.0, 300.0, 600.0)

    def __post_init__(self) -> None:
        for name, grid in self.grids.items():
            AUTOSCALE_POLICIES.check(name)
            for key, values in grid.items():
                if key not in {f.name for f in dataclasses.fields(AutoscaleConfig)} or key == "policy":
                    raise ValueError(f"autoscale_study.grids.{name}.{key} is not an autoscale setting")
                if not values:
                    raise ValueError(f"autoscale_study.grids.{name}.{key} must list at least one value")
        for value in self.cold_starts_s:
            if not value >= 0:
                raise ValueError(f"autoscale_study.cold_starts_s must be >= 0 (seconds), got {value}")


def check_study_reads(autoscale: AutoscaleConfig, study: AutoscaleStudyConfig) -> list[str]:
    """The policies the study runs (autoscale.policy, else every policy of the grids); a ConfigError
    naming a grid key its policy does not read in any of its runs, or an autoscale setting no run
    reads (no policy run reads it, or each that does takes its grid's values instead)."""
    policies = [autoscale.policy] if autoscale.policy is not None else list(study.grids)
    read: set[str] = set()
    for name in policies:
        grid = study.grids.get(name, {})
        runs = [dataclasses.replace(autoscale, policy=name, **dict(zip(grid, combo)))
                for combo in itertools.product(*grid.values())]
        reads = {key for run in runs for key in run.read_by((name,))}
        policy_specific = {key for _, policy in AUTOSCALE_POLICIES.items() for key in policy.READS}
        for key in grid:
            if key in policy_specific and key not in reads:
                raise ConfigError(f"autoscale_study.grids.{name}.{key} is ignored by autoscale.policy={name} "
                                  f"(it reads {sorted(reads)}); take it out of that grid")
        read |= reads - set(grid)
    runs = f"experiment=autoscale's runs (autoscale.policy={', '.join(policies)}, each with its grid's values)"
    autoscale.check_read("autoscale", policies, read, runs)
    return policies


def _row(kind: str, settings: str, replicas: int, outcome: AutoscaleOutcome) -> dict:
    row = outcome.summary.to_row()
    return {"kind": kind, "policy": row["autoscale_policy"], "settings": settings, "replicas": replicas,
            **{c: row[c] for c in COLUMNS[4:]}}


def run_autoscale_experiment(cfg: DictConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    rc = build_run_config(cfg)
    fleet, router = build_fleet(cfg)
    autoscale, slo = build_autoscale(cfg)
    study = to_dataclass(AutoscaleStudyConfig, section(cfg, "autoscale_study"), "autoscale_study")
    if not slo.is_set:
        raise ConfigError("experiment=autoscale needs an SLO: set slo.ttft_p90_s and/or slo.tpot_p90_s (seconds)")
    policies = check_study_reads(autoscale, study)

    def run(config: AutoscaleConfig, replicas: int, label: str, cold: ColdStart | None = None) -> AutoscaleOutcome:
        return run_autoscaled(rc, dataclasses.replace(fleet, replicas=replicas), router, config, slo,
                              output.progress, cold, label, TIMELINE_STEP_COLUMNS)

    rows = []
    static = dataclasses.replace(autoscale, policy=None)
    for n in range(autoscale.min_replicas, autoscale.max_replicas + 1):  # fewest replicas first
        outcome = run(static, n, f"static x {n}")
        require_served(outcome.fleet, f"static x {n}")  # nothing served, nothing to compare: one line, not NaN rows
        rows.append(_row("static", f"replicas={n}", n, outcome))
        if rows[-1]["slo_met"]:
            break
    best: tuple[float, AutoscaleConfig, AutoscaleOutcome] | None = None
    start = min(max(fleet.replicas, autoscale.min_replicas), autoscale.max_replicas)
    for name in policies:
        grid = study.grids.get(name, {})
        for combo in itertools.product(*grid.values()):
            settings = dict(zip(grid, combo))
            config = dataclasses.replace(autoscale, policy=name, **settings)
            text = " ".join(f"{k}={v}" for k, v in settings.items())
            outcome = run(config, start, f"{name} {text}")
            rows.append(_row("autoscale", text, start, outcome))
            if rows[-1]["slo_met"] and (best is None or rows[-1]["cost"] < best[0]):
                best = (rows[-1]["cost"], config, outcome)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table.to_csv(out_dir / "autoscale.csv", index=False)
    from harness.autoscale.plots import plot_cost_attainment

    plot_cost_attainment(table, slo, rc, out_dir / "autoscale_cost.png")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(_savings(table))
    if best is not None:
        write_autoscale_outcome(best[2], out_dir / "best", dataclasses.replace(output, steps="none"), slo)
        colds = [_row("cold_start", f"startup_s={t:g}", start, run(best[1], start, f"cold start {t:g} s",
                                                                   ColdStart(provision_s=t)))
                 for t in (0.0, *study.cold_starts_s)]
        cold = pd.DataFrame(colds, columns=list(COLUMNS))
        cold["attainment_lost"] = cold["slo_attainment"].iloc[0] - cold["slo_attainment"]
        cold.to_csv(out_dir / "cold_start.csv", index=False)
        print(cold[["settings", "slo_attainment", "attainment_lost", "cost"]].to_string(index=False))
    print(f"outputs: {out_dir} (autoscale.csv, autoscale_cost.png, cold_start.csv, best/)")
    return table


def _savings(table: pd.DataFrame) -> str:
    met = table[table["slo_met"] == True]  # noqa: E712 (a column of bools and Nones)
    static, scaled = met[met["kind"] == "static"], met[met["kind"] == "autoscale"]
    if static.empty or scaled.empty:
        return "savings: no static fleet and autoscaling policy both meet the SLO (see autoscale.csv)"
    s, a = static.loc[static["cost"].idxmin()], scaled.loc[scaled["cost"].idxmin()]
    saved = 1.0 - a["cost"] / s["cost"] if s["cost"] > 0 else math.nan
    return (f"savings: {a['policy']} ({a['settings']}) costs ${a['cost']:.2f} at SLO attainment "
            f"{a['slo_attainment']:.3f}, the cheapest static fleet ({s['settings']}) ${s['cost']:.2f} at "
            f"{s['slo_attainment']:.3f}: {100 * saved:.1f}% saved")


__all__ = ["SLO", "AutoscaleStudyConfig", "run_autoscale_experiment"]
