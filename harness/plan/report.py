"""What a deployment search tells its user: the workload's fit to max_model_len, plan_summary.csv
(one row: the workload, the SLO and the cheapest deployment, or the nearest when none meets it)
and, when none meets it, a few lines naming the nearest deployments and what to relax."""

from __future__ import annotations

import math

import pandas as pd

from harness.workloads import Workload, WorkloadConfig

# a deployment as the summary and the messages show it
DEPLOYMENT_COLUMNS = ("cost_per_hour", "hardware", "tp_size", "replicas", "gpus", "policy", "router",
                      "max_num_seqs", "max_num_batched_tokens", "ttft_p90_s", "tpot_p90_s", "slo_ratio")


def fit_note(workload: Workload, cfg: WorkloadConfig, max_model_len: int) -> str | None:
    """One line when some requests do not fit max_model_len (the plan is then for the clipped or
    reduced workload), with both ways out; None when all fit."""
    total = len(workload.requests) + workload.num_skipped
    if workload.num_skipped:
        done = (f"{workload.num_skipped:,} of {total:,} requests are longer than max_model_len={max_model_len} and "
                "left out")
        other = "workload.oversize=clip to plan for them clipped"
    elif workload.num_clipped:
        done = (f"{workload.num_clipped:,} of {total:,} requests are longer than max_model_len={max_model_len} and "
                f"planned clipped ({workload.prompt_tokens_clipped:,} prompt and {workload.output_tokens_clipped:,} "
                "output tokens cut)")
        other = "workload.oversize=skip to leave them out"
    else:
        return None
    return (f"workload {cfg.label}: {done}; to plan for them whole, set scheduler.max_model_len={workload.longest} "
            f"(the longest request), or {other}")


def plan_summary(table: pd.DataFrame, slo, label: str, workload: Workload, max_model_len: int,
                 oversize: str) -> dict:
    """plan_summary.csv's row: what was planned for, and the cheapest deployment meeting the SLO
    (meets_slo True) or else the nearest one (meets_slo False; empty when none could run)."""
    chosen = choose(table)
    # a mixture-of-experts plan also says where the experts go
    columns = (*DEPLOYMENT_COLUMNS, "expert_parallel") if "expert_parallel" in table else DEPLOYMENT_COLUMNS
    deployment = {c: (chosen[c] if chosen is not None else None) for c in columns}
    return {
        "workload": label, "num_requests": len(workload.requests), "max_model_len": max_model_len,
        "oversize": oversize, **workload.fit_counts(), "longest_request_tokens": workload.longest,
        "slo_ttft_p90_s": slo.ttft_p90_s, "slo_tpot_p90_s": slo.tpot_p90_s,
        "deployments_evaluated": len(table),
        "meets_slo": bool(chosen is not None and chosen["meets_slo"]), **deployment,
    }


def choose(table: pd.DataFrame) -> pd.Series | None:
    """The cheapest deployment meeting the SLO, else the nearest (lowest slo_ratio) that ran."""
    if table.empty:
        return None
    meeting = table[table["meets_slo"]]
    if len(meeting):
        return meeting.sort_values(["cost_per_hour", "ttft_p90_s"]).iloc[0]
    ran = table[table["error"] == ""]
    return ran.sort_values(["slo_ratio", "cost_per_hour"]).iloc[0] if len(ran) else None


def nearest_lines(table: pd.DataFrame, slo, count: int) -> tuple[list[str], str]:
    """When no deployment meets the SLO: lines for the `count` nearest deployments and what to
    relax, and the one-line error naming the SLO and the nearest."""
    targets = f"P90 TTFT <= {slo.ttft_p90_s:g} s and P90 TPOT <= {slo.tpot_p90_s:g} s"
    ran = table[table["error"] == ""]
    if ran.empty:
        reason = table["error"].iloc[0] if len(table) else "the search space is empty"
        return [], f"slo: no deployment in the search space meets {targets}: none could run ({reason})"
    nearest = ran.sort_values(["slo_ratio", "cost_per_hour"]).head(count)
    lines = [f"no deployment meets {targets} ({len(table)} evaluated, all in plan.csv); the nearest:"]
    lines += [f"  {_describe(row)}: P90 TTFT {row['ttft_p90_s']:.3g} s ({row['ttft_p90_s'] / slo.ttft_p90_s:.2g}x), "
              f"P90 TPOT {row['tpot_p90_s']:.3g} s ({row['tpot_p90_s'] / slo.tpot_p90_s:.2g}x)"
              for _, row in nearest.iterrows()]
    best = nearest.iloc[0]
    relax = " ".join(f"slo.{name}={_round_up(best[name])}" for name in ("ttft_p90_s", "tpot_p90_s")
                     if best[name] > getattr(slo, name))
    if best["num_rejected"]:
        relax = f"{relax} with a larger KV cache: the nearest rejected {int(best['num_rejected'])} requests"
    lines.append(f"relax the SLO ({relax or 'no target'} would admit the nearest), or widen the search "
                 "(plan.hardware, plan.tp_sizes, plan.max_num_seqs, plan.max_replicas); more replicas stop "
                 "helping once a request alone misses the SLO")
    error = (f"slo: no deployment in the search space meets {targets}; the nearest, {_describe(best)}, has P90 TTFT "
             f"{best['ttft_p90_s']:.3g} s and TPOT {best['tpot_p90_s']:.3g} s (relax to {relax or 'it'})")
    return lines, error


def pools_text(row: pd.Series) -> str:
    """A plan.csv row's replicas in words, either mode (pool sizes as ints, however the table's
    dtypes came out; a disaggregated row's pools may differ in GPU type and TP size)."""
    if row.get("mode") == "disaggregated":
        return (f"{int(row['prefill_replicas'])}P x {row['prefill_hardware']} TP {int(row['prefill_tp'])} + "
                f"{int(row['decode_replicas'])}D x {row['decode_hardware']} TP {int(row['decode_tp'])}")
    return f"{int(row['replicas'])} x {row['hardware']} TP {int(row['tp_size'])}"


def _describe(row: pd.Series) -> str:
    return (f"${row['cost_per_hour']:.2f}/h {pools_text(row)} "
            f"({row['policy']}, {row['router']}, {int(row['max_num_seqs'])} seqs, "
            f"{int(row['max_num_batched_tokens'])} batched tokens)")


def _round_up(seconds: float) -> str:
    """A target just above `seconds`, with two significant digits."""
    if seconds <= 0 or not math.isfinite(seconds):
        return f"{seconds:g}"
    step = 10 ** (math.floor(math.log10(seconds)) - 1)
    return f"{math.ceil(seconds / step) * step:.2g}"
