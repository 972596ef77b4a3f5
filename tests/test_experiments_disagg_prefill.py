"""experiments/disagg/prefill_steps.py (a measure call's prefill steps matched to their requests,
their simulated price and the KV sends in flight) and prefill_probe.py (prefill steps under
controlled conditions: the device measurement that decides what the first cannot)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.disagg import prefill_probe, prefill_steps, run_disagg

SMALL = ["--cpu", "--min-requests", "8", "--max-requests", "10", "--drain-requests", "10", "--max-drain", "12",
         "--drain-s", "0.1", "--warmup-requests", "4", "--cell-s", "1", "--workloads", "long", "--keep-steps",
         "--loads", "0.5"]
DELAY, SLOW = 0.002, 1.5


def _summary(out, tmp_path) -> pd.DataFrame:
    assert prefill_steps.main([str(out), "--out", str(tmp_path / "report")]) == 0
    table = pd.read_csv(tmp_path / "report" / "prefill_summary.csv", dtype={"load": str})
    return table[table["load"] == "0.5"].set_index("side")


def test_an_injected_hand_over_delay_and_slowdown_are_reported_and_the_sends_counted(tmp_path):
    out = tmp_path / "out"
    assert run_disagg.main(["measure", *SMALL, "--dry-run", "--out", str(out)]) == 0
    clean = _summary(out, tmp_path)
    assert set(clean.index) == {"measured", "roofline"}  # the simulator on both sides of a dry run
    assert clean["over_priced"].eq(1.0).all() and clean["delay_p50_ms"].abs().max() < 1e-3
    assert clean.loc["measured", "steps"] > 0
    sends = pd.read_csv(tmp_path / "report" / "prefill_steps.csv.gz", dtype={"load": str})
    measured = sends[sends["side"] == "measured"]
    assert measured["send_overlap"].between(0, 1).all()
    assert sends[sends["side"] != "measured"]["send_overlap"].isna().all()

    # every measured prefill step starts DELAY later and lasts SLOW times longer
    path = out / "steps_1P1D_long_0.5.csv.gz"
    steps = pd.read_csv(path)
    prefill = (steps["side"] == "measured") & (steps["pool"] == "prefill")
    steps.loc[prefill, "start"] += DELAY
    steps.loc[prefill, "duration"] *= SLOW
    steps.to_csv(path, index=False, compression="gzip")
    slowed = _summary(out, tmp_path)
    assert slowed.loc["measured", "over_priced"] == pytest.approx(SLOW)
    assert slowed.loc["measured", "excess_ms"] == pytest.approx((SLOW - 1) * slowed.loc["roofline", "measured_ms"])
    assert slowed.loc["measured", "delay_p50_ms"] == pytest.approx(1e3 * DELAY, abs=0.05)
    assert slowed.loc["roofline", "over_priced"] == 1.0
    with_send = slowed.loc["measured", ["over_priced_with_send", "over_priced_without_send"]].dropna()
    assert len(with_send) and with_send.to_numpy() == pytest.approx(SLOW)


def test_a_folder_without_kept_steps_is_one_line_and_exit_2(tmp_path, capsys):
    assert prefill_steps.main([str(tmp_path)]) == 2
    assert "run_disagg measure --keep-steps" in capsys.readouterr().err


def test_probe_summary_flags_steps_over_their_back_to_back_median():
    rows = [("back_to_back", 0.010), ("back_to_back", 0.010), ("idle_sleep", 0.0135), ("idle_sleep", 0.020)]
    steps = pd.DataFrame([{"condition": c, "tokens": 64, "regime": "graph", "duration_s": d, "launch_s": 0.001,
                           "hop_s": np.nan, "gc_s": 0.0} for c, d in rows])
    table = prefill_probe.summarize(steps).set_index("condition")
    assert table.loc["back_to_back", "slow_share"] == 0.0 and table.loc["idle_sleep", "slow_share"] == 0.5
    assert table.loc["idle_sleep", "median_ms"] == pytest.approx(16.75)


@pytest.mark.slow
@pytest.mark.parametrize("peer", [False, True])
def test_probe_runs_every_condition_on_cpu(tmp_path, peer):
    out = tmp_path / "probe"
    extra = [] if peer else ["--no-peer"]
    assert prefill_probe.main(["--cpu", "--tokens", "16,24", "--repeats", "2", "--gap-ms", "1", *extra,
                               "--out", str(out)]) == 0
    steps = pd.read_csv(out / "probe_steps.csv")
    expected = [c for c in prefill_probe.CONDITIONS if peer or c not in prefill_probe.PEER_CONDITIONS]
    assert list(dict.fromkeys(steps["condition"])) == list(expected)
    assert len(steps) == 2 * 2 * len(expected) and (steps["duration_s"] > 0).all()
    handover = steps[steps["condition"] == "handover"]
    assert handover["hop_s"].gt(0).all() if peer else handover.empty
    parts = steps[steps["condition"] == "idle_parts"]
    assert parts["build_s"].gt(0).all() and parts["anchor_s"].isna().all()  # no device clock on CPU
    assert steps.loc[steps["condition"] != "idle_parts", "build_s"].isna().all()
    summary = pd.read_csv(out / "probe_summary.csv")
    assert len(summary) == 2 * len(expected) and summary["slow_share"].between(0, 1).all()
