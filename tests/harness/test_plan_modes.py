"""The planner's choice between aggregated and disaggregated fleets goes the way the physics says,
and plan_summary.csv names each mode's cheapest deployment meeting the SLO and the winner.

Both workloads run Qwen3-8B on H100s at TP 1 with chunked prefill (policy mixed), so the only
question is the fleet's shape.
"""

from __future__ import annotations

import logging
import re

import pandas as pd
import pytest

from harness.convert import ConfigError
from harness.study import run_study
from tests.harness.conftest import compose_config

SPACE = ["experiment=plan", "model=qwen3-8b", "workload=poisson", "plan.hardware=[h100]", "plan.tp_sizes=[1]",
         "plan.max_num_seqs=[64]", "plan.max_num_batched_tokens=[8192]", "plan.policies=[mixed]",
         "plan.routers=[least_requests]", "plan.modes=[aggregated,disaggregated]", "output.plots=false",
         "output.progress=false"]

# Long prompts (6-8k tokens), short answers, a tight TPOT. In an aggregated replica every decode
# step that carries an 8k-token prefill chunk takes ~100 ms instead of ~8 ms, and each request's
# decodes meet several such chunks: holding P90 TPOT at 12 ms takes 3 aggregated replicas, each
# seeing a third of the prefills. A decode replica never runs a prefill, so 1 prefill + 1 decode
# replica (2 GPUs; the KV of a 7k-token prompt crosses NVLink in a few ms) hold it.
LONG_PROMPTS = ["workload.num_requests=80", "workload.rate=4", "workload.prompt_len.low=6000",
                "workload.prompt_len.high=8000", "workload.output_len.low=100", "workload.output_len.high=200",
                "scheduler.max_model_len=8400", "slo.ttft_p90_s=2", "slo.tpot_p90_s=0.012"]

# Short prompts (100-300 tokens), longer answers: prefill is a small share of the work, so a
# prefill replica mostly idles while one decode replica carries every running request (a batch
# too large for a 15 ms TPOT). Two aggregated replicas split the decodes and fit their short
# prefills in between; disaggregation needs 1 prefill + 2 decode replicas, a third GPU, and pays
# a transfer per request besides.
SHORT_PROMPTS = ["workload.num_requests=200", "workload.rate=80", "workload.prompt_len.low=100",
                 "workload.prompt_len.high=300", "workload.output_len.low=100", "workload.output_len.high=300",
                 "slo.ttft_p90_s=0.5", "slo.tpot_p90_s=0.015"]


def _plan(overrides, out) -> tuple[pd.DataFrame, pd.Series]:
    run_study(compose_config([*SPACE, *overrides]), out)
    return pd.read_csv(out / "plan.csv"), pd.read_csv(out / "plan_summary.csv").iloc[0]


def _cheapest(table: pd.DataFrame, mode: str) -> pd.Series:
    rows = table[(table["mode"] == mode) & table["meets_slo"]]
    return rows.sort_values("cost_per_hour").iloc[0]


def test_long_prompts_and_a_tight_tpot_pick_disaggregation(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        table, summary = _plan(LONG_PROMPTS, tmp_path)
    aggregated, disaggregated = _cheapest(table, "aggregated"), _cheapest(table, "disaggregated")
    assert int(aggregated["gpus"]) == 3 and int(disaggregated["gpus"]) == 2
    assert (int(disaggregated["prefill_replicas"]), int(disaggregated["decode_replicas"])) == (1, 1)
    # the aggregated pair fails on TPOT, not TTFT: prefill chunks stall its decodes
    pair = table[(table["mode"] == "aggregated") & (table["replicas"] == 2)].iloc[0]
    assert pair["ttft_p90_s"] < 2 and pair["tpot_p90_s"] > 0.012 > disaggregated["tpot_p90_s"]
    assert summary["winner"] == "disaggregated" and summary["cost_per_hour"] == disaggregated["cost_per_hour"]
    assert summary["aggregated_cost_per_hour"] == aggregated["cost_per_hour"]
    assert summary["disaggregated_deployment"].startswith("1P x h100 TP 1 + 1D x h100 TP 1 (2 GPUs)")
    assert summary["aggregated_deployment"].startswith("3 x h100 TP 1 (3 GPUs)")
    log = caplog.text
    assert "cheapest aggregated deployment meeting the SLO: $9.00/h, 3 x h100 TP 1" in log
    assert "cheapest disaggregated deployment meeting the SLO: $6.00/h, 1P x h100 TP 1 + 1D" in log
    assert "winner: disaggregated ($6.00/h)" in log
    assert "TP 1.0" not in log and "TP nan" not in log


def test_short_prompts_pick_aggregation_and_the_dearer_mode_is_still_named(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        table, summary = _plan(SHORT_PROMPTS, tmp_path)
    aggregated, disaggregated = _cheapest(table, "aggregated"), _cheapest(table, "disaggregated")
    assert int(aggregated["gpus"]) == 2 and int(aggregated["replicas"]) == 2
    # searched past the aggregated best ($6/h): the cheapest disaggregated fleet meeting the SLO costs more
    assert (int(disaggregated["prefill_replicas"]), int(disaggregated["decode_replicas"])) == (1, 2)
    assert disaggregated["cost_per_hour"] > aggregated["cost_per_hour"]
    one_decode = table[(table["mode"] == "disaggregated") & (table["decode_replicas"] == 1)].iloc[0]
    assert not one_decode["meets_slo"] and one_decode["tpot_p90_s"] > 0.015
    assert summary["winner"] == "aggregated" and summary["tp_size"] == 1
    assert summary["disaggregated_cost_per_hour"] == disaggregated["cost_per_hour"]
    assert "cheapest disaggregated deployment meeting the SLO: $9.00/h, 1P x h100 TP 1 + 2D" in caplog.text
    assert "winner: aggregated ($6.00/h)" in caplog.text
    assert "TP 1.0" not in caplog.text


def test_an_aggregated_only_plan_keeps_its_summary_columns(tmp_path):
    _, summary = _plan([*SHORT_PROMPTS, "plan.modes=[aggregated]"], tmp_path)
    assert "winner" not in summary and "disaggregated_deployment" not in summary


# One long prompt at a time (7-8k tokens, 0.5 req/s) and a 150 ms P90 TTFT: a TP 1 prefill
# replica takes ~195 ms whatever the pool's size, a TP 2 one ~135 ms, while one TP 1 decode
# replica holds any TPOT. The cheapest fleet meeting it mixes the pools' TP sizes.
MIXED_TP = ["plan.tp_sizes=[1,2]", "plan.modes=[disaggregated]", "workload.num_requests=30", "workload.rate=0.5",
            "workload.prompt_len.low=7000", "workload.prompt_len.high=8000", "workload.output_len.low=50",
            "workload.output_len.high=100", "scheduler.max_model_len=8400", "slo.ttft_p90_s=0.15",
            "slo.tpot_p90_s=1"]


def test_the_planner_searches_pools_of_two_tp_sizes_and_picks_a_tp2_prefill_for_a_tp1_decode(tmp_path):
    table, summary = _plan(MIXED_TP, tmp_path)
    best = _cheapest(table, "disaggregated")
    assert (int(best["prefill_tp"]), int(best["decode_tp"]), int(best["gpus"])) == (2, 1, 3)
    assert summary["disaggregated_deployment"].startswith("1P x h100 TP 2 + 1D x h100 TP 1 (3 GPUs)")
    # the KV crosses as many NVLinks as the smaller pool has GPUs: one for TP 1 -> 1, 1 -> 2, 2 -> 1
    transfer = table.groupby(["prefill_tp", "decode_tp"])["transfer_p50_s"].first()
    assert transfer[1, 2] == transfer[1, 1] == transfer[2, 1]
    assert set(table["prefill_tp"]) == {1, 2} and set(table["decode_tp"]) == {1, 2}


def test_a_disaggregated_search_that_meets_no_slo_names_its_nearest_pools_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"the nearest, \$9.00/h 1P x h100 TP 2 \+ 1D x h100 TP 1 ") as error:
        run_study(compose_config([*SPACE, *MIXED_TP, "slo.ttft_p90_s=0.01"]), tmp_path)
    assert "\n" not in str(error.value)


def test_a_two_mode_plan_writes_counts_as_whole_numbers(tmp_path, capsys):
    """Each mode leaves the other's pool or TP columns empty; the counts that are there stay
    whole numbers in plan.csv and in the printed answer (not 1.0 GPUs' TP)."""
    run_study(compose_config([*SPACE, "workload.num_requests=30", "workload.rate=5", "workload.prompt_len.high=300",
                              "workload.output_len.high=150", "plan.disagg_max_pool_replicas=1"]), tmp_path)
    text = (tmp_path / "plan.csv").read_text().splitlines()
    columns = text[0].split(",")
    counts = [columns.index(c) for c in ("tp_size", "prefill_tp", "prefill_replicas", "decode_tp", "decode_replicas")]
    cells = [line.split(",")[i] for line in text[1:] for i in counts]
    assert cells and all(cell == "" or cell.isdigit() for cell in cells), cells
    answer = capsys.readouterr().out
    assert re.search(r"\btp_size\b", answer) and not re.search(r"\s1\.0\s", answer)


@pytest.mark.parametrize("override", ["plan.expert_parallel=[true]", "plan.batch_size=4",
                                      "plan.parallel_backend=processes"])
def test_a_plan_setting_only_the_aggregated_search_reads_is_refused_without_it(override, tmp_path):
    # the disaggregated search runs one candidate at a time, experts placed by execution.expert_parallel
    with pytest.raises(ConfigError, match=rf"^{re.escape(override.split('=')[0])}=.* is ignored by "
                                          r"plan.modes=\['disaggregated'\]; it is read only with plan.modes including"):
        run_study(compose_config([*SPACE, "plan.modes=[disaggregated]", override]), tmp_path)
