"""`python -m harness experiment=plan`: the deployment search (harness.plan.search) run on the
composed config, its tables, plot and answer."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from harness.config import OutputConfig, RunConfig, build_run_config, on_hardware
from harness.convert import ConfigError
from harness.fleet.config import build_fleet, check_router_read
from harness.parallel import parallel_map
from harness.plan.config import PlanConfig, SLOConfig, build_plan, load_catalogue, refuse_searched
from harness.plan.evaluate import PlanBase
from harness.plan.report import DEPLOYMENT_COLUMNS, fit_note, nearest_lines, plan_summary
from harness.plan.search import configurations, search
from harness.workloads import build_workload, fit_warnings_muted

log = logging.getLogger(__name__)


def title_of(rc: RunConfig, label: str, slo: SLOConfig, over: str = "") -> str:
    return (f"{rc.model.name}, {label}{'; ' + over if over else ''}, "
            f"SLO P90 TTFT {slo.ttft_p90_s:g} s / TPOT {slo.tpot_p90_s:g} s")


def run_plan(cfg: DictConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    """`python -m harness experiment=plan ...`: plan.csv, plan_summary.csv, plan.png, the cheapest
    deployment (or the nearest, and a ConfigError naming the SLO)."""
    from harness.plan.plots import plot_plan

    rc = build_run_config(cfg)
    if rc.backend != "sim":
        raise ConfigError(f"backend.name must be sim for the deployment search, got {rc.backend!r}")
    plan, slo = build_plan(cfg)
    refuse_searched(cfg, rc)
    _, router = build_fleet(cfg)
    check_router_read(router, plan.routers, f"experiment=plan's plan.routers={list(plan.routers)}")
    base = PlanBase(rc, load_catalogue(plan.hardware), slo, router)
    configs = configurations(plan, rc)
    _log_profiles(base)
    label, max_model_len = rc.workload.label, rc.scheduler.max_model_len
    # Built once up front: a bad trace fails here once, and the fit is reported once for the plan.
    # NOTE: clipped requests are planned for, with a warning, not refused: a deployment's
    # max_model_len is often the limit it will serve, and a planner wants the answer with the caveat.
    with fit_warnings_muted():
        workload = build_workload(rc.workload, max_model_len)
    if not len(workload):
        raise ConfigError(f"nothing to plan for: all {workload.num_skipped} requests of workload {label} are longer "
                          f"than max_model_len={max_model_len} and workload.oversize=skip leaves them out; set "
                          f"scheduler.max_model_len={workload.longest} (the longest request) or workload.oversize=clip")
    note = fit_note(workload, rc.workload, max_model_len)
    if note:
        log.warning(note)
    mapper = map if plan.parallel_backend == "serial" else partial(
        parallel_map, backend=plan.parallel_backend, address=plan.parallel_address,
        num_workers=plan.parallel_num_workers)
    table = search(configs, base, plan.max_replicas, plan.batch_size, output.progress, mapper) \
        if "aggregated" in plan.modes else pd.DataFrame()
    if "disaggregated" in plan.modes:
        from harness.plan.disagg import compare_modes

        table = compare_modes(table, plan, base, slo, title_of(rc, label, slo), out_dir, output.progress)
    table.to_csv(out_dir / "plan.csv", index=False)
    summary = plan_summary(table, slo, label, workload, max_model_len, rc.workload.oversize)
    if "disaggregated" in plan.modes:
        from harness.plan.disagg import mode_summary

        summary.update(mode_summary(table, plan.modes))
    pd.DataFrame([summary]).to_csv(out_dir / "plan_summary.csv", index=False)
    over = f"{workload.num_clipped or workload.num_skipped:,} requests over max_model_len" if note else ""
    title = title_of(rc, label, slo, over)
    plot_plan(table, slo, title, out_dir / "plan.png")
    print(f"{len(table)} deployments evaluated ({label}); outputs: {out_dir} (plan.csv, plan_summary.csv, plan.png)")
    _answer(table, summary, plan, slo, over)
    return table


def _answer(table: pd.DataFrame, summary: dict, plan: PlanConfig, slo: SLOConfig, over: str) -> None:
    """Print the cheapest deployment meeting the SLO (and each mode's, with both modes), or the
    nearest ones and a ConfigError naming the SLO."""
    if not summary["meets_slo"]:
        lines, error = nearest_lines(table, slo, plan.num_closest)
        print("\n".join(lines))
        raise ConfigError(error)
    _log_cheapest(summary)
    # the fit's warning came before the search's output: the answer says again that it is for the fitted requests
    print(f"cheapest deployment meeting the SLO{f' (with {over}: see the warning above)' if over else ''}:")
    shown = [c for c in (*DEPLOYMENT_COLUMNS, "expert_parallel") if c in summary]
    print(pd.DataFrame([summary])[shown].to_string(index=False))
    if "winner" in summary:
        for mode in plan.modes:
            print(f"cheapest {mode}: {summary[f'{mode}_deployment'] or 'none meets the SLO'}")
        print(f"winner: {summary['winner']}")


def _log_profiles(base: PlanBase) -> None:
    """Which fit prices each catalogue GPU, when the simulator is profiled (harness.config.on_hardware)."""
    if base.rc.sim is None or base.rc.sim.cost_model != "profiled":
        return
    for name, spec in base.catalogue.items():
        sim = on_hardware(base.rc, spec).sim
        carried = f", carried from {sim.profile_hardware.name}" if sim.profile_hardware is not None else ""
        log.info("plan: %s priced by the profile %s%s", name, sim.profile_path, carried)


def _log_cheapest(summary: dict) -> None:
    """The cheapest deployment in one log line; a disaggregated one (no single TP size) by its pools."""
    if summary.get("winner") == "disaggregated":
        log.info("cheapest deployment meeting the SLO: $%.2f/h: %s, max_num_seqs %d, max_num_batched_tokens %d",
                 summary["cost_per_hour"], summary["disaggregated_deployment"], summary["max_num_seqs"],
                 summary["max_num_batched_tokens"])
        return
    gpus = int(summary["gpus"])
    log.info("cheapest deployment meeting the SLO: $%.2f/h: %d x %s (TP %d, %d GPU%s), policy %s, router %s, "
             "max_num_seqs %d, max_num_batched_tokens %d: P90 TTFT %.3f s, P90 TPOT %.4f s",
             *(summary[c] for c in ("cost_per_hour", "replicas", "hardware", "tp_size")), gpus,
             "" if gpus == 1 else "s",
             *(summary[c] for c in ("policy", "router", "max_num_seqs", "max_num_batched_tokens", "ttft_p90_s",
                                    "tpot_p90_s")))
