"""The disaggregated half of the deployment search (plan.modes includes disaggregated).

A candidate is each pool's GPU type and TP size (plan.hardware x plan.tp_sizes, per pool), the
scheduler knobs, the policy, one router for both pools (plan.routers) and P, D in
1..plan.disagg_max_pool_replicas. The link is the plan's choice: NVLink where both pools are one
GPU type and the fleet fits one node, else the network. Candidates are simulated cheapest first
until one meets the SLO: it is the cheapest disaggregated deployment (every cheaper one was
tried), or plan.disagg_max_evals evaluations run out first (logged). The search does not stop at
the aggregated mode's best price: the log and plan_summary.csv name each mode's cheapest deployment
meeting the SLO, so each is searched to its own answer, and the winner is the cheaper of the two.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from itertools import product

import pandas as pd
from tqdm import tqdm

from harness.convert import ConfigError
from harness.fleet.disagg import run_disagg_once
from harness.fleet.disagg_config import DisaggConfig, PoolConfig
from harness.output.metrics import SUMMARY_STEP_COLUMNS
from harness.plan.report import pools_text
from harness.plan.row import MEASURE_COLUMNS, hourly_cost
from harness.run import cyclic_gc_paused
from harness.workloads import fit_warnings_muted
from sim.kv_transfer import TransferConfig

log = logging.getLogger(__name__)

POOL_COUNTS = ("prefill_tp", "prefill_replicas", "decode_tp", "decode_replicas")
# a disaggregated row's metric columns: the aggregated rows' and its transfers'
MEASURES = (*MEASURE_COLUMNS, "transfer_p50_s", "transfer_p90_s")


@dataclasses.dataclass(frozen=True)
class Candidate:
    prefill_hardware: str
    prefill_tp: int
    decode_hardware: str
    decode_tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str
    router: str
    prefill_replicas: int
    decode_replicas: int

    @property
    def gpus(self) -> int:
        return self.prefill_tp * self.prefill_replicas + self.decode_tp * self.decode_replicas


def candidates(plan, catalogue: dict) -> list[Candidate]:
    n = range(1, plan.disagg_max_pool_replicas + 1)
    return [Candidate(*values) for values in product(plan.hardware, plan.tp_sizes, plan.hardware, plan.tp_sizes,
                                                     plan.max_num_seqs, plan.max_num_batched_tokens, plan.policies,
                                                     plan.routers, n, n)]


def cost_per_hour(c: Candidate, catalogue: dict) -> float:
    return hourly_cost((catalogue[c.prefill_hardware].price_per_gpu_hour, c.prefill_tp * c.prefill_replicas),
                       (catalogue[c.decode_hardware].price_per_gpu_hour, c.decode_tp * c.decode_replicas))


def _link(c: Candidate, catalogue: dict) -> str:
    same = c.prefill_hardware == c.decode_hardware
    return "nvlink" if same and c.gpus <= catalogue[c.prefill_hardware].gpus_per_node else "network"


def evaluate(c: Candidate, base) -> dict:
    """One plan.csv row (base: harness.plan.evaluate.PlanBase)."""
    cost = cost_per_hour(c, base.catalogue)
    head = {"mode": "disaggregated", "hardware": f"{c.prefill_hardware}/{c.decode_hardware}",
            "tp_size": math.nan, "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
            "policy": c.policy, "router": c.router, "replicas": c.prefill_replicas + c.decode_replicas,
            **{f: getattr(c, f) for f in ("prefill_hardware", "prefill_tp", "prefill_replicas", "decode_hardware",
                                          "decode_tp", "decode_replicas")},
            "gpus": c.gpus, "cost_per_hour": cost}
    started = time.perf_counter()
    fleet = DisaggConfig(prefill_replicas=c.prefill_replicas, decode_replicas=c.decode_replicas,
                         prefill=PoolConfig(c.prefill_tp, c.prefill_hardware),
                         decode=PoolConfig(c.decode_tp, c.decode_hardware),
                         transfer=TransferConfig(link=_link(c, base.catalogue)))
    scheduler = dataclasses.replace(base.rc.scheduler, policy=c.policy, max_num_seqs=c.max_num_seqs,
                                    max_num_batched_tokens=c.max_num_batched_tokens)
    try:
        with cyclic_gc_paused(), fit_warnings_muted():
            outcome = run_disagg_once(dataclasses.replace(base.rc, scheduler=scheduler), fleet,
                                      dataclasses.replace(base.router, name=c.router), progress=False,
                                      step_columns=(*SUMMARY_STEP_COLUMNS, "start", "duration", "free_blocks"))
    except (ValueError, TypeError, ConfigError) as error:
        return {**head, **dict.fromkeys(MEASURES, math.nan), "slo_ratio": math.inf, "meets_slo": False,
                "error": str(error).splitlines()[0], "eval_s": time.perf_counter() - started}
    s = outcome.summary
    measures = {k: s.labels.num_rejected if k == "num_rejected" else s[k] for k in MEASURES}
    rejected = measures["num_rejected"]
    ratio = max(s.ttft_p90_s / base.slo.ttft_p90_s, s.tpot_p90_s / base.slo.tpot_p90_s)
    ratio = ratio if math.isfinite(ratio) else math.inf
    return {**head, **measures, "slo_ratio": ratio,
            "meets_slo": bool(ratio <= 1.0 and rejected == 0), "error": "", "eval_s": time.perf_counter() - started}


def search_disaggregated(plan, base, progress: bool = False) -> pd.DataFrame:
    """Candidates cheapest first until one meets the SLO or plan.disagg_max_evals run out. With one
    replica per pool every router routes alike, so only the first router is tried there."""
    ordered = sorted((c for c in candidates(plan, base.catalogue)
                      if c.prefill_replicas > 1 or c.decode_replicas > 1 or c.router == plan.routers[0]),
                     key=lambda c: (cost_per_hour(c, base.catalogue), c.gpus))
    rows = []
    for c in tqdm(ordered[: plan.disagg_max_evals], desc="disaggregated deployments", unit="dep",
                  disable=not progress, leave=False):
        row = evaluate(c, base)
        rows.append(row)
        if row["meets_slo"]:
            break
    else:
        if len(ordered) > plan.disagg_max_evals:
            log.warning("disaggregated search: plan.disagg_max_evals=%d evaluations ran out (%d candidates, cheapest "
                        "first) before one met the SLO", plan.disagg_max_evals, len(ordered))
    return pd.DataFrame(rows)


def cheapest_by_mode(table: pd.DataFrame, modes) -> dict[str, pd.Series]:
    """mode -> its cheapest row meeting the SLO (modes without one are left out)."""
    cheapest = {}
    for mode in modes:
        rows = table[(table["mode"] == mode) & table["meets_slo"].astype(bool)] if len(table) else table
        if len(rows):
            cheapest[mode] = rows.sort_values(["cost_per_hour", "ttft_p90_s"]).iloc[0]
    return cheapest


def winner_of(cheapest: dict[str, pd.Series]) -> str:
    """The mode whose cheapest deployment costs least ('' when none meets the SLO); equal costs go
    to the lower P90 TTFT, as plan_summary's choice (harness.plan.report.choose) does."""
    return min(cheapest, key=lambda m: (cheapest[m]["cost_per_hour"], cheapest[m]["ttft_p90_s"]), default="")


def mode_summary(table: pd.DataFrame, modes) -> dict:
    """plan_summary.csv's per-mode columns: each mode's cheapest deployment meeting the SLO and the winner."""
    cheapest = cheapest_by_mode(table, modes)
    out: dict = {}
    for mode in modes:
        best = cheapest.get(mode)
        out[f"{mode}_cost_per_hour"] = best["cost_per_hour"] if best is not None else math.nan
        out[f"{mode}_deployment"] = describe(best) if best is not None else ""
    out["winner"] = winner_of(cheapest)
    return out


def compare_modes(aggregated: pd.DataFrame, plan, base, slo, title: str, out_dir, progress: bool) -> pd.DataFrame:
    """plan.csv with both modes (a mode column), plan_modes.png, and the log's cheapest of each mode."""
    from harness.plan.plots import plot_modes

    disaggregated = search_disaggregated(plan, base, progress)
    table = pd.concat([aggregated.assign(mode="aggregated") if len(aggregated) else aggregated, disaggregated],
                      ignore_index=True)
    # each mode leaves the other's counts empty: nullable ints keep the rest whole numbers, not floats
    counts = [c for c in ("tp_size", *POOL_COUNTS) if c in table]
    table[counts] = table[counts].astype("Int64")
    cheapest = cheapest_by_mode(table, plan.modes)
    for mode in plan.modes:
        if mode in cheapest:
            log.info("cheapest %s deployment meeting the SLO: $%.2f/h, %s", mode, cheapest[mode]["cost_per_hour"],
                     describe(cheapest[mode]))
        else:
            log.info("no %s deployment evaluated meets the SLO", mode)
    if cheapest:
        winner = winner_of(cheapest)
        log.info("winner: %s ($%.2f/h)", winner, cheapest[winner]["cost_per_hour"])
    plot_modes(table, slo, title, out_dir / "plan_modes.png")
    return table


def describe(row: pd.Series) -> str:
    """One deployment of either mode in words."""
    return (f"{pools_text(row)} ({int(row['gpus'])} GPUs), policy {row['policy']}, router {row['router']}: "
            f"P90 TTFT {row['ttft_p90_s']:.3f} s, P90 TPOT {row['tpot_p90_s']:.4f} s")
