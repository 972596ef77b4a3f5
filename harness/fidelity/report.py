"""The held-out table's rows and its plot (harness.fidelity.study)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from harness.compare.tables import rel_error
from harness.output.figures import save_figure
from sim.cost_model import COST_MODELS

LOAD_METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "e2e_p90_s")
OFFLINE_METRICS = ("request_s", "output_tok_s", "ttft_p50_s", "tpot_p50_s")
COUNTED_METRICS = ("preemptions",)  # a run's count, beside every cell's latencies
PLOTTED = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
# The profiled model priced at the speed of the host that served the cell, read off its engine runs'
# decode graph launches (harness.fidelity.serving_host; resimulate.py --host-scales names such rows
# profiled_run_host). Where a cell has one, it is the cell's "profiled" prediction and the prediction
# at the profile's host is kept beside it as GRID_HOST (at_measured_host).
MEASURED_HOST = ("profiled_host", "profiled_run_host")
GRID_HOST = "profiled_grid_host"
HOST_COLUMNS = ("host_scale", "host_measured", "device_scale", "power_curve")  # the machine a row was priced for
# each cost model's line; "carried" is a profiled model fitted on another GPU (harness.fidelity.study)
LINE_STYLES = {"profiled": "-", "roofline": ":", "carried": "--", GRID_HOST: "-."}
READABLE = {"ttft_p50_s": "TTFT P50", "ttft_p90_s": "TTFT P90", "tpot_p50_s": "TPOT P50", "tpot_p90_s": "TPOT P90",
            "e2e_p50_s": "E2E P50", "e2e_p90_s": "E2E P90", "request_s": "throughput (req/s)",
            "output_tok_s": "output throughput (tok/s)", "preemptions": "preemptions"}


def engine_spread(values: np.ndarray) -> float:
    """(max - min) / mean of the engine's repeats of one cell."""
    mean = float(np.mean(values))
    return float(np.ptp(values) / mean) if mean else 0.0


def holds(lo: float, hi: float, engine: float) -> bool | None:
    """Whether the interval [lo, hi] holds the engine's value; None where there is no interval."""
    return bool(lo <= engine <= hi) if np.isfinite(lo) and np.isfinite(hi) else None


def cell_rows(rc, workload: str, load: str, rate: float, engine_runs: list[dict], sims: dict[str, dict],
              metrics) -> list[dict]:
    """One row per metric and cost model of a cell."""
    rows = []
    for metric in metrics:
        values = np.array([run[metric] for run in engine_runs], dtype=float)
        engine = float(np.mean(values))
        for cost_model, summary in sims.items():
            lo, hi = summary.get(f"{metric}_lo", np.nan), summary.get(f"{metric}_hi", np.nan)
            inside = holds(lo, hi, engine)
            rows.append({"model": rc.model.name, "hardware": rc.hardware.name, "workload": workload, "load": load,
                         "metric": metric, "engine": engine, "sim": float(summary[metric]),
                         "err": rel_error(float(summary[metric]), engine), "cost_model": cost_model,
                         "engine_spread": engine_spread(values), "sim_lo": lo, "sim_hi": hi, "in_interval": inside,
                         "rate_req_s": rate, "engine_repeats": len(values),
                         **{k: float(summary[k]) for k in ("host_scale", "host_jitter") if k in summary}})
    return rows


def interval_coverage(table: pd.DataFrame) -> float:
    """Share of the cells with an interval whose engine value falls inside it."""
    inside = table["in_interval"].dropna()
    return float(inside.astype(bool).mean()) if len(inside) else float("nan")


def plot_heldout(table: pd.DataFrame, path: Path) -> bool:
    """Error (sim - engine) / engine against load, one panel per workload class; the engine's own
    spread as a band around zero. False, and no file, for a table without load rows (an
    offline-only run): a figure of empty panels would read as a failed run."""
    from matplotlib.figure import Figure

    online = table[table["load"].astype(str) != "offline"].copy()
    if online.empty:
        return False
    online["load_x"] = online["load"].astype(float)
    workloads = list(dict.fromkeys(online["workload"]))  # an offline-only class has no panel
    columns = min(3, len(workloads))
    rows = -(-len(workloads) // columns)
    fig = Figure(figsize=(4.6 * columns, 3.6 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, columns, sharey=True, squeeze=False)).ravel()
    for ax in axes[len(workloads):]:
        ax.set_visible(False)
    model, hardware = table["model"].iloc[0], table["hardware"].iloc[0]
    for ax, workload in zip(axes, workloads):
        part = online[online["workload"] == workload]
        for i, metric in enumerate(PLOTTED):
            rows = part[part["metric"] == metric]
            for cost_model in (*COST_MODELS.names(), "carried", GRID_HOST):
                line = rows[rows["cost_model"] == cost_model].sort_values("load_x")
                if len(line):
                    ax.plot(line["load_x"], 100 * line["err"], LINE_STYLES.get(cost_model, "-."), marker="o",
                            color=f"C{i}", label=f"{READABLE[metric]} ({cost_model})")
        spread = part[part["cost_model"] == part["cost_model"].iloc[0]] if len(part) else part
        if len(spread):
            band = spread.groupby("load_x")["engine_spread"].max()
            ax.fill_between(band.index, -100 * band, 100 * band, color="grey", alpha=0.2, label="engine spread")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"{model} on {hardware}: {workload}", fontsize=9)
        ax.set_xlabel("load (fraction of the engine's capacity)")
        ax.grid(alpha=0.3)
    for ax in axes[::columns]:
        ax.set_ylabel("error (sim - engine) / engine (%)")
    axes[len(workloads) - 1].legend(fontsize=6)
    save_figure(fig, path)
    return True


CELL_KEYS = ["model", "hardware", "workload", "load", "metric", "cost_model"]


def merge(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Held-out tables of several device calls (one per model or per group of classes) as one."""
    merged = pd.concat(tables, ignore_index=True)
    return merged.drop_duplicates(CELL_KEYS, keep="last")


def at_measured_host(table: pd.DataFrame) -> pd.DataFrame:
    """The table with each cell's profiled prediction at the serving host where its call measured it
    (MEASURED_HOST rows become "profiled"; the cell's prediction at the profile's host is kept as
    GRID_HOST), and two columns: host_scale, the host speed a row was priced at (1: the profile's
    host, as every row of a cell without a measured host and every roofline row, which has no host
    parts), and host_measured. A GRID_HOST row whose cell's profiled row is not at a measured host
    (a later call replaced it) is dropped. Idempotent."""
    keys = [k for k in CELL_KEYS if k != "cost_model"]
    table = table.reset_index(drop=True)
    measured = table["cost_model"].isin(MEASURED_HOST).to_numpy()
    if measured.any() and ("host_scale" not in table or table.loc[measured, "host_scale"].isna().any()):
        raise ValueError("a measured-host row (cost_model profiled_host or profiled_run_host) has no host_scale")
    cells = pd.MultiIndex.from_frame(table[keys].astype(str))
    moved = measured | (table["host_measured"].fillna(False).astype(bool).to_numpy()
                        if "host_measured" in table else False)
    at_host = cells.isin(cells[moved])
    out = table.copy()
    out.loc[(out["cost_model"] == "profiled").to_numpy() & at_host & ~moved, "cost_model"] = GRID_HOST
    out.loc[measured, "cost_model"] = "profiled"
    scale = out["host_scale"] if "host_scale" in out else pd.Series(np.nan, index=out.index)
    out["host_scale"] = scale.where(moved, 1.0).astype(float)
    out["host_measured"] = moved
    kept = out[(out["cost_model"] != GRID_HOST).to_numpy() | at_host]
    return kept.drop_duplicates(CELL_KEYS, keep="last").reset_index(drop=True)  # a later call's GRID_HOST row


def pool(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Held-out tables whose calls served the same cells (other machines, other leases) as one
    table of every call's repeats: engine is the mean over all repeats, engine_repeats their
    count, engine_calls the calls pooled, and engine_spread the larger of a call's own spread and
    the calls' means apart ((max - min) / mean), so it says what a machine changes. Each call set
    its rates from the capacity it measured, and simulated its cells at those rates: the simulated
    side (sim and its interval) is pooled with the same weights, so both sides average the same
    cells, and err and in_interval are taken again. A cell served by one call passes through."""
    table = pd.concat([t.assign(engine_calls=t.get("engine_calls", 1)) for t in tables], ignore_index=True)
    table["engine_repeats"] = table["engine_repeats"].fillna(1).astype(int)
    rows = []
    for _, cell in table.groupby(CELL_KEYS, sort=False, dropna=False):
        row = cell.iloc[-1].to_dict()
        if len(cell) > 1:
            weights = cell["engine_repeats"].to_numpy(dtype=float)
            means = cell["engine"].to_numpy(dtype=float)
            engine = float(np.average(means, weights=weights))
            sim, lo, hi = (float(np.average(cell[c].to_numpy(dtype=float), weights=weights))
                           for c in ("sim", "sim_lo", "sim_hi"))
            row.update(engine=engine, engine_repeats=int(weights.sum()), engine_calls=int(cell["engine_calls"].sum()),
                       engine_spread=max(engine_spread(means), float(cell["engine_spread"].max())), sim=sim,
                       err=rel_error(sim, engine), sim_lo=lo, sim_hi=hi, rate_req_s=float(np.average(
                           cell["rate_req_s"].to_numpy(dtype=float), weights=weights)))
            row["in_interval"] = holds(lo, hi, engine)
            if "host_scale" in cell:  # the hosts priced, with the same weights; measured only if every call's was
                hosts = cell["host_scale"].fillna(1.0).to_numpy(dtype=float)
                row["host_scale"] = float(np.average(hosts, weights=weights))
                measured = cell["host_measured"] if "host_measured" in cell else pd.Series(False, index=cell.index)
                row["host_measured"] = bool(measured.fillna(False).astype(bool).all())
        rows.append(row)
    return pd.DataFrame(rows, columns=table.columns)


def coverage_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, GPU and load: cells with an interval, the share holding the engine's value, and the
    profiled model's median |err| on the latency percentiles (the README's table); a last row
    "all" pools every cell of the table. Where the table has the intervals' bounds, also the share
    inside the conformalised interval (harness.fidelity.conformal: calibrated per group, each class
    held out of its own) over the cells whose group had enough other cells, the fewest calibration
    cells a cell of the group had, how many cells had too few (an infinite margin: no coverage is
    claimed for them) and the group's median margin."""
    profiled = table[(table["cost_model"] == "profiled") & table["metric"].isin(LOAD_METRICS)]
    if {"sim_lo", "sim_hi", "engine"} <= set(profiled.columns) and profiled["in_interval"].notna().any():
        from harness.fidelity.conformal import leave_one_class_out

        bounded = profiled["in_interval"].notna()
        profiled = pd.concat([leave_one_class_out(profiled[bounded]), profiled[~bounded]])
    groups = list(profiled.groupby(["model", "hardware", "load"])) + [(("all", "all", "all"), profiled)]
    rows = []
    for (model, hardware, load), part in groups:
        row = {"model": model, "hardware": hardware, "load": load,
               "cells": int(part["in_interval"].notna().sum()), "in_interval": interval_coverage(part),
               "median_abs_err": float(part["err"].abs().median()),
               "median_engine_spread": float(part["engine_spread"].median())}
        if "in_interval_conformal" in part.columns:
            inside = part["in_interval_conformal"].dropna()
            margin = part["conformal_margin"].dropna()
            row["in_interval_conformal"] = float(inside.astype(bool).mean()) if len(inside) else float("nan")
            row["calibration_cells"] = int(part["calibration_cells"].dropna().min()) if len(margin) else 0
            row["too_few_cells"] = int(np.isinf(margin).sum())
            row["conformal_margin"] = float(margin.median()) if len(margin) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def plot_coverage(coverage: pd.DataFrame, path: Path, level: float = 0.9) -> None:
    """Per model, GPU and load: the share of cells inside the propagated interval and inside the
    conformalised one, the level as a line; a group with too few calibration cells is marked."""
    from matplotlib.figure import Figure

    groups = coverage[coverage["model"] != "all"].reset_index(drop=True)
    labels = [f"{m}\n{h.split('-')[0]} {load}"
              for m, h, load in zip(groups["model"], groups["hardware"], groups["load"])]
    x = np.arange(len(groups))
    fig = Figure(figsize=(max(6.0, 0.75 * len(groups)), 4.6), layout="constrained")
    ax = fig.subplots()
    ax.bar(x - 0.2, 100 * groups["in_interval"], 0.4, label="propagated interval (sim.interval)")
    if "in_interval_conformal" in groups.columns:
        ax.bar(x + 0.2, 100 * groups["in_interval_conformal"].fillna(0), 0.4,
               label="conformal, per group, class held out")
        for i in np.flatnonzero(groups["too_few_cells"].to_numpy() > 0):
            ax.text(x[i] + 0.2, 2, "too few\ncells", ha="center", fontsize=6, rotation=90)
    ax.axhline(100 * level, color="black", lw=0.8, ls="--", label=f"{100 * level:.0f}% asked")
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_ylim(0, 105)
    ax.set_ylabel("cells inside the interval (%)")
    ax.set_title("Held-out cells inside their 90% interval, per model, GPU and load", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    save_figure(fig, path)


def target_table(table: pd.DataFrame, loads=("0.5", "0.8"), bound: float = 0.10) -> pd.DataFrame:
    """Per model, workload and cost model: how many of the target cells (TTFT and TPOT P50/P90
    at 50% and 80% load) are within `bound` of the engine."""
    cells = table[table["metric"].isin(PLOTTED) & table["load"].astype(str).isin(loads)]
    within = cells.assign(within=cells["err"].abs() <= bound)
    out = within.groupby(["model", "hardware", "workload", "cost_model"], sort=False)["within"].agg(["sum", "count"])
    return out.rename(columns={"sum": "within_10pct", "count": "cells"}).reset_index()
