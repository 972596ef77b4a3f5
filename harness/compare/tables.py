"""The comparison's tables: metrics side by side, schedule identity, and the replay of measured steps.

- metrics_table: one row per metric (throughput in/out, TTFT/TPOT/E2E percentiles, preemptions,
  recomputed tokens, prefix-cache hit rate, ...), a column per run (engine, sim_<cost model>) and
  the relative error of each simulated run against the engine: (sim - engine) / engine (0 where
  both are 0).
- schedule_table: per simulated run, whether its step sequence is the engine's (same requests,
  same token counts, same preemptions, step by step: harness.output.recording.schedule_hash), else the
  first step where they part and the time each clock read there.
- replay: every measured engine step priced by each cost model from its recorded features, so
  the per-step error is the cost model's alone, whatever the schedules did. Measured = the
  executor's time + the loop's host time (what the engine's clock advanced by).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.features import REPEATED_FEATURES
from sim.profiled import HOST_STALL_S
from sim.roofline import RooflineCostModel

METRICS = (
    "input_tok_s", "output_tok_s", "total_tok_s", "request_s", "makespan_s",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
    "e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s",
    "preemptions", "recomputed_tokens", "prefix_hit_rate", "num_steps",
)
REPLAY_STATS = ("median", "p90", "max")


def rel_error(sim: float, engine: float) -> float:
    if engine == 0:
        return 0.0 if sim == 0 else float("inf")
    return (sim - engine) / engine


def metrics_table(summaries: dict[str, dict]) -> pd.DataFrame:
    """summaries: run name -> summary row; "engine" first."""
    rows = []
    for metric in METRICS:
        row = {"metric": metric}
        for name, summary in summaries.items():
            row[name] = float(summary[metric])
        for name in summaries:
            if name != "engine":
                row[f"err_{name}"] = rel_error(row[name], row["engine"])
        rows.append(row)
    return pd.DataFrame(rows)


def interval_columns(table: pd.DataFrame, intervals: dict[str, dict]) -> pd.DataFrame:
    """For each run with an interval (run name -> summary with <metric>_lo/_hi, sim.interval),
    columns lo_<run>, hi_<run> and in_interval_<run>: whether the engine's value falls inside."""
    table = table.copy()
    for run, summary in intervals.items():
        lo = table["metric"].map({m: summary.get(f"{m}_lo", np.nan) for m in table["metric"]}).astype(float)
        hi = table["metric"].map({m: summary.get(f"{m}_hi", np.nan) for m in table["metric"]}).astype(float)
        table[f"lo_{run}"], table[f"hi_{run}"] = lo, hi
        inside = (lo <= table["engine"]) & (table["engine"] <= hi)
        table[f"in_interval_{run}"] = inside.where(lo.notna() & hi.notna())
    return table


def schedule_table(engine_steps: pd.DataFrame, sims: dict[str, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    theirs = engine_steps["schedule_hash"].astype(str).to_numpy()
    for name, steps in sims.items():
        ours = steps["schedule_hash"].astype(str).to_numpy()
        common = min(len(theirs), len(ours))
        differ = np.flatnonzero(theirs[:common] != ours[:common])
        first = int(differ[0]) if len(differ) else (common if len(theirs) != len(ours) else -1)
        rows.append({
            "run": name, "engine_steps": len(theirs), "sim_steps": len(ours),
            "schedule_identical": first < 0,
            "first_divergent_step": first,
            "engine_time_at_divergence_s":
                float(engine_steps["start"].iloc[first]) if 0 <= first < len(theirs) else np.nan,
            "sim_time_at_divergence_s": float(steps["start"].iloc[first]) if 0 <= first < len(ours) else np.nan,
            "identical_steps": int((theirs[:common] == ours[:common]).sum()),
            "engine_preemptions": int(engine_steps["preempted"].sum()),
            "sim_preemptions": int(steps["preempted"].sum()),
        })
    return pd.DataFrame(rows)


def roofline_step_times(model: RooflineCostModel, features: pd.DataFrame) -> np.ndarray:
    """RooflineCostModel.step_time of each recorded step, from its features (no plan needed)."""
    f = features
    context = f["prefill_context_tokens"] + f["decode_context_tokens"] - f["num_decode_tokens"]
    # decode_context_tokens counts each decode's own new token: decode_attention_pairs of the step
    pairs = f["prefill_attention_pairs"] + f["decode_context_tokens"]
    columns = list(REPEATED_FEATURES)
    # tables recorded before the repeated-read columns existed: none counted
    repeated = f[columns].sum(axis=1) if set(columns) <= set(f.columns) else np.zeros(len(f), dtype=int)
    return np.array([model.time_for(int(t), int(s), int(c), int(p), int(n), int(r)) for t, s, c, p, n, r in
                     zip(f["num_tokens"], f["num_sampled"], context, pairs, f["num_seqs"], repeated)], dtype=float)


def replay(engine_steps: pd.DataFrame, predictors: dict[str, object]) -> pd.DataFrame:
    """Per engine step: measured and predicted seconds under each cost model, and the errors.

    predictors: name -> ProfiledCostModel or RooflineCostModel."""
    steps = engine_steps
    host = steps["host_s"] if "host_s" in steps.columns else 0.0
    out = pd.DataFrame({"step": steps["step"], "kind": steps["kind"], "num_seqs": steps["num_seqs"],
                        "num_tokens": steps["num_tokens"], "cuda_graph": steps["cuda_graph"],
                        "measured_execute_s": steps["duration"], "measured_host_s": host})
    out["measured_s"] = out["measured_execute_s"] + out["measured_host_s"]
    table = steps.rename(columns={"duration": "duration_s"})
    # the measured predecessor of each step: what it hid of an overlapped eager step (sim.profiled);
    # none after the loop slept for an arrival (nothing was in flight: the step pays its whole lead)
    table["previous_duration_s"] = table["duration_s"].shift(1).where(table["step"] != 0)
    if "slept_s" in table.columns:
        table.loc[table["slept_s"] > 0, "previous_duration_s"] = 0.0
    for name, model in predictors.items():
        if isinstance(model, RooflineCostModel):
            predicted = roofline_step_times(model, table)
        else:
            predicted = model.predict(table, include_host=True)
            out[f"predicted_execute_{name}_s"] = model.predict(table)
        out[f"predicted_{name}_s"] = predicted
        out[f"err_{name}"] = (predicted - out["measured_s"]) / out["measured_s"]
    return out


def replay_rows(steps: pd.DataFrame, names: list[str]) -> list[dict]:
    """Summary rows of a replay for the metrics table (abs relative per-step error, total time)."""
    rows = []
    busy = {"metric": "replay_busy_s", "engine": float(steps["measured_s"].sum())}
    for name in names:
        busy[f"sim_{name}"] = float(steps[f"predicted_{name}_s"].sum())
        busy[f"err_sim_{name}"] = rel_error(busy[f"sim_{name}"], busy["engine"])
    rows.append(busy)
    # Host stalls (garbage-collector pauses) are in the engine's clock; no cost model predicts them.
    stalls = steps["measured_host_s"][steps["measured_host_s"] > HOST_STALL_S]
    rows.append({"metric": "engine_host_stalls", "engine": float(len(stalls)),
                 **{f"sim_{n}": 0.0 for n in names}, **{f"err_sim_{n}": np.nan for n in names}})
    rows.append({"metric": "engine_host_stall_s", "engine": float(stalls.sum()),
                 **{f"sim_{n}": 0.0 for n in names}, **{f"err_sim_{n}": np.nan for n in names}})
    for stat in REPLAY_STATS:
        row = {"metric": f"replay_step_abs_err_{stat}", "engine": 0.0}
        for name in names:
            err = np.abs(steps[f"err_{name}"].to_numpy())
            value = {"median": np.median, "p90": lambda e: np.percentile(e, 90), "max": np.max}[stat](err)
            row[f"sim_{name}"] = float(value)
            row[f"err_sim_{name}"] = float(value)
        rows.append(row)
    return rows


def targets(table: pd.DataFrame, schedule: pd.DataFrame, offline: bool, throughput_tol: float,
            latency_tol: float) -> pd.DataFrame:
    """The comparison's targets (throughput and latency tolerances) per simulated run: pass/fail,
    the value that decided it and what that value is."""
    by_metric = table.set_index("metric")
    rows = []
    for _, sched in schedule.iterrows():
        run = sched["run"]
        err = by_metric[f"err_{run}"]
        checks = [(f"{m} within {tol:.0%} of the engine", abs(err[m]), abs(err[m]) < tol, "absolute relative error")
                  for m, tol in [("input_tok_s", throughput_tol), ("output_tok_s", throughput_tol)]
                  + [(m, latency_tol) for m in ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")]]
        if offline:
            identical = bool(sched["schedule_identical"])
            first = int(sched["first_divergent_step"])
            checks.append(("schedule identical", np.nan if identical else float(first), identical,
                           f"all {sched['engine_steps']} steps identical" if identical
                           else f"first divergent step (0-based): {first}"))
            checks.append(("preemptions equal", float(sched["sim_preemptions"] - sched["engine_preemptions"]),
                           sched["sim_preemptions"] == sched["engine_preemptions"], "sim minus engine preemptions"))
        rows += [{"run": run, "target": name, "value": value, "met": bool(ok), "value_is": meaning}
                 for name, value, ok, meaning in checks]
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """A pipe table (no tabulate dependency); a `|` inside a cell is escaped so it cannot split the row."""
    def cell(v) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else f"{v:.{digits}g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)
