"""run_disagg measure --keep-steps: each cell's per-replica steps, measured and simulated, kept in a
small gzipped file per cell, read back, and compared by experiments/disagg/step_report.py."""

from __future__ import annotations

import tarfile

import pandas as pd
import pytest

from experiments.disagg import run_disagg, step_report
from experiments.disagg.h200_06b_graphs8k import summary
from experiments.disagg.kept_steps import KEPT_COLUMNS, read_kept

SMALL = ["--cpu", "--min-requests", "6", "--max-requests", "10", "--drain-requests", "10", "--max-drain", "12",
         "--drain-s", "0.1", "--warmup-requests", "4", "--cell-s", "1", "--workloads", "long", "--keep-steps"]
CELLS = {f"steps_{fleet}_long_{load}.csv.gz" for fleet in ("1P1D", "2x") for load in ("offline", "0.5", "0.8")}
SLOW, GAP = 1.5, 0.002


def _report(folder, tmp_path) -> pd.DataFrame:
    assert step_report.main([str(folder), "--out", str(tmp_path / "report")]) == 0
    return pd.read_csv(tmp_path / "report" / "step_report.csv", keep_default_na=False, na_values=[""])


def _rows(report: pd.DataFrame, fleet: str, load: str, pool: str, replica: int) -> pd.DataFrame:
    mine = report[(report["fleet"] == fleet) & (report["load"].astype(str) == load) & (report["pool"] == pool)
                  & (report["replica"] == replica)]
    return mine.set_index("kind")


def test_kept_steps_are_read_back_and_an_injected_slowdown_and_gap_are_reported(tmp_path):
    out = tmp_path / "out"
    assert run_disagg.main(["measure", *SMALL, "--dry-run", "--out", str(out)]) == 0
    assert {p.name for p in out.glob("steps_*.csv.gz")} == CELLS
    for name in CELLS:
        steps = read_kept(out / name)
        assert list(steps.columns[:len(KEPT_COLUMNS)]) == list(KEPT_COLUMNS)
        measured, sim = (steps[steps["side"] == s].drop(columns="side").reset_index(drop=True)
                         for s in ("measured", "roofline"))
        pd.testing.assert_frame_equal(measured, sim)  # the simulator on both sides of a dry run
        assert (steps["kv_tokens"] >= 0).all() and (steps["duration"] > 0).all()
        pools = {"prefill", "decode"} if name.startswith("steps_1P1D") else {"aggregated"}
        assert set(steps["pool"]) == pools
    clean = _report(out, tmp_path)
    assert clean["measured_over_sim"].eq(1.0).all() and clean["measured_over_priced"].between(0.99, 1.01).all()

    # the decode replica's measured steps 1.5x slower; the second aggregated replica 2 ms idle before each step
    path = out / "steps_1P1D_long_0.8.csv.gz"
    steps = pd.read_csv(path)
    slow = (steps["side"] == "measured") & (steps["pool"] == "decode")
    steps.loc[slow, "duration"] *= SLOW
    steps.to_csv(path, index=False, compression="gzip")
    path = out / "steps_2x_long_0.5.csv.gz"
    steps = pd.read_csv(path)
    late = (steps["side"] == "measured") & (steps["replica"] == 1)
    steps.loc[late, "start"] += GAP * steps[late].groupby("replica").cumcount()
    steps.to_csv(path, index=False, compression="gzip")

    report = _report(out, tmp_path)
    decode = _rows(report, "1P1D", "0.8", "decode", 0)
    assert decode.loc["decode", "measured_over_sim"] == pytest.approx(SLOW)
    assert decode.loc["decode", "measured_over_priced"] == pytest.approx(SLOW, rel=0.01)
    assert decode.loc["decode", "batch_measured"] == decode.loc["decode", "batch_sim"]
    assert _rows(report, "1P1D", "0.8", "prefill", 0).loc["prefill", "measured_over_sim"] == 1.0
    late_rows, other = _rows(report, "2x", "0.5", "aggregated", 1), _rows(report, "2x", "0.5", "aggregated", 0)
    assert late_rows.loc["all", "measured_over_sim"] == 1.0  # the steps themselves are as priced
    # the gap grows by GAP wherever the simulated one is clipped at 0 or not: never less, on average GAP
    assert late_rows.loc["all", "gap_measured_s"] - late_rows.loc["all", "gap_sim_s"] == pytest.approx(GAP, abs=2e-4)
    assert other.loc["all", "gap_measured_s"] == pytest.approx(other.loc["all", "gap_sim_s"])
    batches = pd.read_csv(tmp_path / "report" / "step_batches.csv")
    slowed = batches[(batches["fleet"] == "1P1D") & (batches["load"].astype(str) == "0.8")
                     & (batches["pool"] == "decode")]
    assert slowed["group"].str.startswith("decode (").all()
    assert slowed["measured_over_sim"].to_numpy() == pytest.approx(SLOW)
    # by exact batch, and per decoding pool: the slow steps, the lost time, the same batches
    sizes = pd.read_csv(tmp_path / "report" / "step_sizes.csv")
    sized = sizes[(sizes["fleet"] == "1P1D") & (sizes["load"].astype(str) == "0.8") & (sizes["pool"] == "decode")]
    assert len(sized) > 1 and sized["measured_over_sim"].to_numpy() == pytest.approx(SLOW)
    summary = pd.read_csv(tmp_path / "report" / "step_summary.csv").assign(load=lambda t: t["load"].astype(str))
    assert set(summary["pool"]) == {"decode", "aggregated"}  # prefill replicas decode nothing
    row = summary.set_index(["fleet", "load", "pool"])
    slow = row.loc[("1P1D", "0.8", "decode")]
    assert slow["decode_over_priced"] == pytest.approx(SLOW, rel=0.01)
    assert slow["decode_s_measured"] == pytest.approx(SLOW * slow["decode_s_sim"])
    assert slow["batch_measured"] == pytest.approx(slow["batch_sim"])
    late, fine = row.loc[("2x", "0.5", "aggregated")], row.loc[("1P1D", "0.5", "decode")]
    assert late["gap_share_measured"] > late["gap_share_sim"] and fine["gap_share_measured"] == fine["gap_share_sim"]


def test_bad_step_input_is_refused_in_one_line(tmp_path, capsys):
    assert step_report.main([str(tmp_path)]) == 2
    assert "--keep-steps" in capsys.readouterr().err
    path = tmp_path / "steps_2x_long_0.5.csv.gz"
    path.write_text("a,b\n1,2\n")  # not gzipped
    assert step_report.main([str(tmp_path)]) == 2
    assert "not a kept steps file" in capsys.readouterr().err
    pd.DataFrame({"a": [1]}).to_csv(path, index=False, compression="gzip")
    assert step_report.main([str(path)]) == 2
    assert "not a kept steps file (no [" in capsys.readouterr().err
    assert run_disagg.main(["goodput", "--keep-steps", "--cpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--keep-steps" in err and "\n" not in err


@pytest.mark.slow
def test_keep_steps_end_to_end_on_cpu_engines(tmp_path):
    out, bundle = tmp_path / "out", tmp_path / "ship" / "m.tar.gz"
    assert run_disagg.main(["measure", *SMALL, "--out", str(out), "--bundle", str(bundle)]) == 0
    with tarfile.open(bundle) as tar:
        assert {n.split("/")[-1] for n in tar.getnames() if "/steps_" in n} == CELLS
    report = _report(out, tmp_path)
    # every replica ran steps on both sides, and the measured ones are the CPU engine's
    assert (report["steps_measured"] > 0).all() and (report["steps_sim"] > 0).all()
    assert set(zip(report["fleet"], report["pool"], report["replica"])) == {
        ("1P1D", "prefill", 0), ("1P1D", "decode", 0), ("2x", "aggregated", 0), ("2x", "aggregated", 1)}
    assert (report["step_measured_s"] != report["step_sim_s"]).any()


def test_a_size_range_takes_the_quartiles_over_the_sizes_with_enough_steps_on_both_sides():
    cell = {"fleet": "1P1D", "workload": "conversation", "load": "0.8", "pool": "decode"}
    sizes = pd.DataFrame([{**cell, "requests": n, "steps_measured": m, "steps_sim": s, "measured_over_sim": r}
                          for n, m, s, r in ((79, 50, 50, 2.0), (80, 50, 50, 1.0), (90, 50, 50, 1.2),
                                             (100, 50, 50, 1.1), (105, 3, 50, 9.0), (111, 50, 50, 1.3))])
    (row,) = step_report.size_range(sizes, 80, 111, min_steps=10).to_dict("records")
    assert row["sizes"] == 4  # 79 out of range, 105 too few measured steps
    assert (row["p25"], row["p50"], row["p75"]) == pytest.approx((1.075, 1.15, 1.225))


@pytest.mark.slow  # two whole simulated fleets; the default run reads kept steps back (the test above)
def test_a_kept_call_is_priced_again_at_each_cells_measured_host(tmp_path):
    """measure --keep-steps ends with compare_hosts.md: with no launches recorded (a dry run) every
    cell at the profile's host, as the call priced it; with the decode replicas' graph launches
    recorded slow, the host is measured slow and the cells priced slower."""
    import numpy as np

    from experiments.disagg import measured_hosts

    out = tmp_path / "out"
    dry = [a for a in SMALL if a != "--cpu"]
    assert run_disagg.main(["measure", *dry, "--dry-run", "--model", "qwen3-0.6b", "--out", str(out)]) == 0
    as_run = pd.read_csv(out / "resim_hosts.csv")
    errors = as_run.filter(like="_err_pct").drop(columns=["transfer_wait_p90_s_err_pct"])
    assert errors.fillna(0.0).eq(0.0).all().all() and "at measured host" in (out / "compare_hosts.md").read_text()
    for path in out.glob("steps_*.csv.gz"):
        steps = pd.read_csv(path)
        decode = (steps["side"] == "measured") & (steps["kind"] == "decode")
        steps["graph_batch_size"] = np.where(decode, steps["requests"], 0)
        steps["launch_s"] = np.where(decode, 0.02, np.nan)  # ~10x a decode graph's launch
        steps["decode_context_tokens"] = np.where(decode, steps["kv_tokens"], 0)
        steps["decode_repeated_tokens"] = 0
        steps.to_csv(path, index=False, compression="gzip")
    measured_hosts.price_at_measured_hosts(out)
    hosts = pd.read_csv(out / "hosts.csv")
    assert (hosts.loc[hosts["pool"] == "fleet", "host_scale"] > 2).all()
    slower = pd.read_csv(out / "resim_hosts.csv")
    assert (slower["tpot_p50_s"] > as_run["tpot_p50_s"]).all()


def test_a_call_without_a_profile_says_why_its_cells_are_not_priced_at_the_host(tmp_path):
    out = tmp_path / "out"
    assert run_disagg.main(["measure", *SMALL, "--dry-run", "--out", str(out)]) == 0
    text = (out / "compare_hosts.md").read_text()
    assert text.startswith("Not priced at the measured host:") and text.count("\n") == 1
    assert "roofline" in text  # the tiny model's CPU call has no profile to read a host against
    compare = (out / "compare.md").read_text()
    assert "| roofline |" in compare and "at measured host" not in compare


def _graphs_bundle(folder, ttft: float, eager_ms: float) -> None:
    """A measure bundle: one measured and one simulated 1P1D cell, and its kept prefill steps (one of
    3,000 tokens, one of 6,000 taking eager_ms, one of 9,000)."""
    folder.mkdir()
    base = {"fleet": "1P1D", "workload": "long", "load": "0.5", "ttft_p50_s": ttft, "ttft_p90_s": 2 * ttft,
            "tpot_p50_s": 0.003, "tpot_p90_s": 0.004, "e2e_p50_s": 0.5, "request_s": 17.0}
    pd.DataFrame([{"side": "measured", **base}, {"side": "profiled", **base, "ttft_p50_s": 1.0}]).to_csv(
        folder / "runs.csv", index=False)
    steps = [{column: 0 for column in KEPT_COLUMNS} | {"side": "measured", "pool": "prefill", "step": i,
             "prefill_tokens": tokens, "requests": 1, "duration": ms / 1e3, "launch_s": ms / 2e3}
             for i, (tokens, ms) in enumerate([(3000, 9.0), (6000, eager_ms), (9000, 31.0)])]
    pd.DataFrame(steps).to_csv(folder / "steps_1P1D_long_0.5.csv.gz", index=False)


def test_the_graphs_summary_sets_each_pairs_cells_side_by_side(tmp_path):
    _graphs_bundle(tmp_path / "a_4096", 0.025, 24.0)
    _graphs_bundle(tmp_path / "a_8192", 0.020, 18.0)
    summary.main([str(tmp_path / "a_4096"), str(tmp_path / "a_8192"), "--out", str(tmp_path / "out")])
    measured = pd.read_csv(tmp_path / "out" / "measured.csv")
    assert len(measured) == 1 and measured.loc[0, "ttft_p50_s_ratio"] == pytest.approx(0.8)
    assert measured.loc[0, "tpot_p50_s_ratio"] == 1.0 and measured.loc[0, "pair"] == "a_4096"
    steps = pd.read_csv(tmp_path / "out" / "prefill_steps.csv.gz").set_index(["call", "tokens"])
    assert steps.loc[("a_8192", "4097-8192"), "duration_ms"] == 18.0
    assert steps.loc[("a_4096", "4097-8192"), "launch_ms"] == 12.0 and len(steps) == 6
    with pytest.raises(SystemExit):
        summary.main([str(tmp_path / "a_4096"), "--out", str(tmp_path / "out")])
