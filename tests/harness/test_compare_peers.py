"""experiments/peers/compare_peers.py and its peer adapters without the peers: its table, its merge
with the engine's measurement, and how it reads each peer's output, fed with fake peer outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from experiments.peers import common, static_peers, vidur_peer
from experiments.peers import compare_peers as cp
from harness.scripting import compose_run_config
from harness.workloads.build import build_workload

ENGINE = {"output_tok_s": 8000.0, "ttft_p50_s": 1.0, "ttft_p90_s": 2.0, "tpot_p50_s": 0.020, "tpot_p90_s": 0.025}
BENCH = common.SCENARIOS["bench"]
POISSON = common.SCENARIOS["poisson"]

AIC_REPORT = """
  Model:            Qwen/Qwen3-8B
  TTFT:             117.835 ms
  TPOT:             24.369 ms
  Request Latency:  13788.709 ms
  tokens/s:         10,415.48
  tokens/s/gpu:     10,415.48
"""


def test_merge_gives_each_tool_its_error_against_the_engine_and_none_for_the_engine_or_a_missing_metric():
    engine = common.Prediction(common.ENGINE_TOOL, "bench", dict(ENGINE))
    peer = common.Prediction("peer", "bench", {"output_tok_s": 10000.0, "ttft_p50_s": 0.5}, runtime_s=3.0, note="n")
    table = cp.merge(ENGINE, [engine, peer])
    assert table["tool"].tolist() == [common.ENGINE_TOOL, "peer"]
    assert table.loc[0, [f"err_{m}" for m in common.METRICS]].isna().all()
    assert table.loc[1, "err_output_tok_s"] == pytest.approx(0.25)
    assert table.loc[1, "err_ttft_p50_s"] == pytest.approx(-0.5)
    assert math.isnan(table.loc[1, "tpot_p50_s"]) and math.isnan(table.loc[1, "err_tpot_p50_s"])
    assert table.loc[1, "runtime_s"] == 3.0


def test_markdown_shows_ms_and_percent_and_a_dash_for_what_a_tool_does_not_predict():
    table = cp.merge(ENGINE, [common.Prediction(common.ENGINE_TOOL, "bench", dict(ENGINE)),
                              common.Prediction("peer", "bench", {"output_tok_s": 10000.0, "tpot_p50_s": 0.030},
                                            runtime_s=4.25, note="one value per metric")])
    text = cp.markdown(table)
    engine_line, peer_line = [line for line in text.splitlines() if line.startswith("| bench")]
    assert "| 8,000 | 1,000.0 | 2,000.0 | 20.0 | 25.0 | - |" in engine_line
    assert "| 10,000 (+25.0%) | - | - | 30.0 (+50.0%) | - | 4.2 |" in peer_line
    assert "- bench, peer: one value per metric" in text


@pytest.mark.parametrize("num_requests", [5, 256])
def test_steady_state_takes_every_request_offline_and_solves_littles_law_online(num_requests):
    calls = []

    def estimate(batch):  # latency grows with the batch: 1 s + 0.1 s per request
        calls.append(batch)
        return {"ttft": 10.0, "tpot": 1.0, "latency": 1000.0 + 100.0 * batch, "tok_s": 1.0}

    assert static_peers.steady_state(estimate, None, num_requests)[0] == num_requests
    calls.clear()
    batch, out = static_peers.steady_state(estimate, 5.0, num_requests)
    # c = 5 * (1 + 0.1 c) -> c = 10, capped at the workload's size
    assert batch == min(10, num_requests)
    assert out["latency"] == 1000.0 + 100.0 * batch
    assert len(calls) == len(set(calls))  # stops where a batch repeats


def test_static_prediction_reads_aic_reports_and_predicts_no_online_throughput():
    estimate = static_peers.aic_estimate(Path("/nowhere"), 586, 562, run=lambda cmd: AIC_REPORT)
    offline = static_peers.static_prediction("aic", estimate, BENCH, 586, 562, 256)
    assert offline.values == pytest.approx({"output_tok_s": 10415.48, "ttft_p50_s": 0.117835, "tpot_p50_s": 0.024369})
    assert "batch of 256" in offline.note
    online = static_peers.static_prediction("aic", estimate, POISSON, 591, 552, 200)
    assert "output_tok_s" not in online.values
    assert f"batch of {round(POISSON.rate * 13.788709)}" in online.note


def test_a_peer_that_fails_is_listed_with_its_error_and_no_numbers():
    def broken(cmd):
        raise RuntimeError("exit 1: LocalEntryNotFoundError: cannot reach the Hub")

    broken_aic = static_peers.aic_estimate(Path("/x"), 1, 1, run=broken)
    failed = static_peers.static_prediction("aic", broken_aic, BENCH, 1, 1, 4)
    assert failed.values == {} and failed.note.startswith("did not run: exit 1: LocalEntryNotFoundError")
    with pytest.raises(ValueError, match="TPOT"):
        static_peers.parse_aic("TTFT: 1 ms\n")


def test_genz_gets_the_qwen3_8b_shape_and_its_last_json_line_is_read():
    seen = []

    def run(cmd):
        seen.append(json.loads(cmd[-1]))
        return "noise\n" + json.dumps({"ttft": 9.9, "tpot": 13.0, "latency": 100.0, "tok_s": 5.0}) + "\n"

    out = static_peers.genz_estimate(Path("/x"), 586, 562, run=run)(256)
    assert out["tpot"] == 13.0
    assert seen[0]["layers"] == 36 and seen[0]["kv_heads"] == 8
    assert seen[0]["ffn"] == 12288 and seen[0]["batch"] == 256


def test_vidur_trace_and_metrics_round_trip(tmp_path):
    rc = compose_run_config([*common.COMMON, *BENCH.overrides, "workload.num_requests=4"])
    requests = build_workload(rc.workload, rc.scheduler.max_model_len).requests
    trace = pd.read_csv(vidur_peer.vidur_trace(requests, tmp_path / "trace.csv"))
    assert trace.columns.tolist() == ["Date", "Time", "PromptTokenCount", "CompletionTokenCount"]
    assert (trace["Date"] == vidur_peer.VIDUR_DATE).all()
    assert trace["PromptTokenCount"].tolist() == [len(r.prompt_token_ids) for r in requests]
    run = tmp_path / "out" / "2026-01-01_00"
    run.mkdir(parents=True)
    pd.DataFrame({"arrived_at": [0.0, 0.0], "request_e2e_time": [2.0, 4.0], "prefill_e2e_time": [0.1, 0.3],
                  "decode_time_execution_plus_preemption_normalized": [0.01, 0.03]}).to_csv(
        run / "request_metrics.csv", index=False)
    values = vidur_peer.parse_vidur(tmp_path / "out", 400)
    assert values["output_tok_s"] == 100.0
    assert values["ttft_p50_s"] == pytest.approx(0.2) and values["tpot_p90_s"] == pytest.approx(0.028)


def test_an_absent_peer_venv_is_skipped_with_a_message(tmp_path, capsys):
    assert cp.peer_venv(tmp_path / "missing", "Vidur") is None
    assert cp.peer_venv(None, "GenZ") is None
    assert "skipping Vidur" in capsys.readouterr().out


def test_the_engine_measurements_are_committed():
    for scenario in common.SCENARIOS.values():
        row = cp.engine_row(scenario)
        assert set(row.values) == set(common.METRICS) and all(v > 0 for v in row.values.values())
