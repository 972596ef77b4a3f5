"""experiments/disagg: the driver that measures disaggregated and aggregated engine fleets against
their simulations, and the planner's direction by goodput.

Fast: the whole measure flow with a simulator in the engine's place (the same simulator on both
sides must agree exactly: same requests, same blocks, same link), the link fit, goodput's bounds,
and the settings refused before any GPU work. Slow: both sub-commands end to end on CPU with the
tiny model's engine processes and a gloo KV link."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.disagg import common, decode_waves, kv_scatter, run_disagg
from experiments.disagg.cells import Cells, MeasureConfig, fitted_link
from experiments.disagg.common import (
    CPU_LINK,
    LANDING_LAG_S,
    LANDING_LAG_SIGMA,
    RECEIVE_BANDWIDTH,
    SEND_LAG_S,
    SEND_LAG_SIGMA,
    Deadline,
    Pools,
    Setup,
)
from experiments.disagg.goodput import Ladder, measured_goodput
from experiments.disagg.h200_run1 import resim
from experiments.disagg.tables import fit_link, runs_path
from experiments.disagg.transfer_parts import first_boundary
from experiments.disagg.workloads import SCENARIOS
from harness.convert import ConfigError
from sim import idle_start_s
from sim.kv_transfer import TransferConfig
from sim.profiled import ProfiledCostModel

SMALL = ["--cpu", "--min-requests", "6", "--max-requests", "10", "--drain-requests", "10", "--max-drain", "12",
         "--drain-s", "0.1", "--warmup-requests", "4", "--cell-s", "1"]


def _azure_trace() -> str:
    """The conversation class replays the Azure trace: ../shared/traces beside the checkout."""
    try:
        return common.trace_path(None)
    except ConfigError as error:
        pytest.skip(str(error))


def _cells(tmp_path, **kw):
    setup = Setup("tiny-qwen3", "cpu", Pools(1, 1), cpu=True, measured="sim", handshake=kw.get("handshake", True),
                  queue_behind_step=kw.get("queue", True))
    mc = MeasureConfig(("long", "conversation"), (0.5, 0.8), 1.0, 6, 10, 10, 0.1, 12, 4, _azure_trace(), 0.0)
    return Cells(setup, mc, tmp_path, Deadline(kw.get("limit_s", 600.0))).run()


def test_measure_with_the_simulator_measured_agrees_with_itself_exactly(tmp_path):
    # without the handshake and the queue the simulator's transfers are the link's price alone, which the
    # fit recovers
    _cells(tmp_path, handshake=False, queue=False)
    table = pd.read_csv(tmp_path / "compare.csv")
    cells = table.drop_duplicates(["fleet", "workload", "load"])
    assert set(zip(cells["fleet"], cells["workload"], cells["load"].astype(str))) == {
        (f, w, lo) for f in ("1P1D", "2x") for w in ("long", "conversation") for lo in ("offline", "0.5", "0.8")}
    assert (table["rel_error"].abs() < 1e-9).all() and table["within"].all()
    assert set(table.loc[table["metric"] == "transfer_p50_s", "fleet"]) == {"1P1D"}
    assert set(table["sim"]) == {"roofline", "roofline + fitted link"}
    assert set(table.loc[table["sim"] == "roofline + fitted link", "fleet"]) == {"1P1D"}
    # noise-free transfers (the simulator's own): the fit recovers the link it was priced with
    fit = pd.read_csv(tmp_path / "transfer_fit.csv").iloc[0]
    assert fit["bandwidth"] == pytest.approx(CPU_LINK.bandwidth)
    assert fit["latency_s"] == pytest.approx(CPU_LINK.latency_s)


def test_measure_prices_the_engines_handshake_on_both_sides(tmp_path):
    """By default both sides price the engine's protocol: the cells agree exactly, and the
    transfers are no faster than the link alone prices them."""
    _cells(tmp_path)
    table = pd.read_csv(tmp_path / "compare.csv")
    assert (table.loc[table["sim"] == "roofline", "rel_error"].abs() < 1e-9).all()
    fit = pd.read_csv(tmp_path / "transfer_fit.csv").iloc[0]
    assert fit["measured_p50_s"] >= fit["priced_p50_s"]
    moved = pd.read_csv(tmp_path / "transfers.csv")
    assert (moved["transfer_bytes"] > 0).all() and set(moved["load"].astype(str)) == {"offline", "0.5", "0.8"}
    runs = pd.read_csv(tmp_path / "runs.csv")
    offline = runs[(runs["load"] == "offline") & (runs["side"] == "measured")]
    loaded = runs[(runs["load"] == "0.8") & (runs["side"] == "measured")]
    # loads are fractions of each fleet's own drain throughput
    for fleet in ("1P1D", "2x"):
        for workload in ("long", "conversation"):
            capacity = offline[(offline["fleet"] == fleet) & (offline["workload"] == workload)]["request_s"].iloc[0]
            rate = loaded[(loaded["fleet"] == fleet) & (loaded["workload"] == workload)]["rate_req_s"].iloc[0]
            assert rate == pytest.approx(0.8 * capacity)
    text = (tmp_path / "compare.md").read_text()
    assert "| 1P1D | long | offline |" in text and "48 of 48" not in text


def test_any_p_and_d_against_p_plus_d_aggregated_replicas():
    setup = Setup("qwen3-8b", "h100", Pools.parse("3P1D"))
    disagg, aggregated = setup.fleet("disaggregated"), setup.fleet("aggregated")
    assert (disagg.prefill_replicas, disagg.decode_replicas, disagg.transfer.link) == (3, 1, "nvlink")
    assert aggregated.replicas == 4 and setup.pools.gpus == 4
    assert [setup.fleet_label(m) for m in ("disaggregated", "aggregated")] == ["3P1D", "4x"]


@pytest.mark.parametrize(("argv", "flag"), [([], True), (["--queue-behind-step"], True),
                                             (["--no-queue-behind-step"], False)])
def test_the_simulated_link_prices_the_engines_send_path_unless_turned_off(argv, flag, tmp_path):
    """A measure call compares with this engine, whose BlockMover queues each send behind the prefill
    GPU's step in flight: its simulated side prices that by default; the planner's fleet does not."""
    args = run_disagg.parse(["measure", "--cpu", "--out", str(tmp_path), *argv])
    setup = run_disagg.make_setup(args, run_disagg.check(args))
    link = setup.fleet("disaggregated").transfer
    assert (setup.queue_behind_step, link.queue_behind_step, link.handshake) == (flag, flag, True)
    assert Setup("qwen3-8b", "h200", Pools(1, 1)).link().queue_behind_step
    assert not TransferConfig().queue_behind_step  # fleet.transfer's own default: the wire on arrival


@pytest.mark.parametrize(("argv", "flag"), [([], True), (["--no-receive-side"], False)])
def test_a_measure_call_prices_the_engines_receive_side_unless_turned_off(argv, flag, tmp_path):
    """On a GPU the receive side's lags and NCCL's measured rate; on the CPU its made-up link's rate."""
    args = run_disagg.parse(["measure", "--cpu", "--out", str(tmp_path), *argv])
    link = run_disagg.make_setup(args, run_disagg.check(args)).fleet("disaggregated").transfer
    assert (link.recv_behind_step, link.landing_lag_s, link.send_lag_s) == \
        ((True, LANDING_LAG_S, SEND_LAG_S) if flag else (False, 0.0, 0.0))
    assert link.bandwidth == CPU_LINK.bandwidth and link.handshake
    gpu = Setup("qwen3-8b", "h200", Pools(1, 1), receive_side=True).link()
    assert (gpu.bandwidth, gpu.landing_lag_sigma, gpu.send_lag_sigma) == \
        (RECEIVE_BANDWIDTH, LANDING_LAG_SIGMA, SEND_LAG_SIGMA)
    assert Setup("qwen3-8b", "h200", Pools(1, 1), receive_side=True).link(5e10).bandwidth == 5e10
    assert not Setup("qwen3-8b", "h200", Pools(1, 1)).link().recv_behind_step  # the calls before it


@pytest.mark.parametrize("receive_side", [False, True])
def test_the_fitted_link_prices_neither_the_handshake_nor_the_queue(receive_side):
    # the fit holds the measured waits already
    link = fitted_link(Setup("qwen3-8b", "h200", Pools(1, 1), receive_side=receive_side), 5e10, 0.01)
    assert (link.bandwidth, link.latency_s, link.handshake, link.queue_behind_step) == (5e10, 0.01, False, False)
    assert (link.recv_behind_step, link.landing_lag_s, link.send_lag_s) == (False, 0.0, 0.0)


def test_resim_takes_each_calls_own_queue_setting(tmp_path):
    """Re-simulating a committed call reproduces its own pricing: the calls before the send-path
    decision ran without the queue, those after it with it."""
    root = Path("experiments/disagg")
    calls = {p.parent.relative_to(root).as_posix() for p in root.glob("**/runs.csv*")}
    mixes = "h200x4_pd_mixes"
    before = {"h200_run1", "h200_8b_run1", f"{mixes}/measure_1P3D", f"{mixes}/measure_2P2D",
              f"{mixes}/measure_3P1D_u08", f"{mixes}/run2/measure_2P2D", f"{mixes}/run2/measure_3P1D"}
    assert before < calls and len(calls - before) >= 2
    for call in calls:
        assert resim.recorded_queue(root / call) is (call not in before), call
    for flag in (True, False):
        setup = f"Setup(handshake=True, queue_behind_step={flag})"
        (tmp_path / "settings.json").write_text(json.dumps({"setup": setup}))
        assert resim.recorded_queue(tmp_path) is flag
        (tmp_path / "settings.json").write_text(json.dumps({"setup": f"Setup(receive_side={flag})"}))
        assert resim.recorded_receive_side(tmp_path) is flag
    receive = {"h200_06b_run12", "h200_8b_run7"}  # the first calls made with the receive side priced
    assert receive < calls and all(resim.recorded_receive_side(root / call) for call in receive)
    assert not any(resim.recorded_receive_side(root / call) for call in before | {"h200_06b_run11", "h200_8b_run6"})


def test_a_call_out_of_time_skips_cells_and_says_so(tmp_path):
    _cells(tmp_path, limit_s=0.0)
    assert not (tmp_path / "compare.csv").exists()
    assert "disaggregated: not started" in (tmp_path / "compare.md").read_text()


def test_the_link_fit_holds_through_slow_outliers():
    rng = np.random.default_rng(1)
    nbytes = rng.uniform(1e7, 7e8, 300)
    seconds = 2e-4 + nbytes / 3e11
    slow = rng.random(300) < 0.2  # a fifth waited for a decode step
    seconds[slow] += rng.uniform(1e-3, 8e-3, slow.sum())
    fit = fit_link(pd.DataFrame({"transfer_bytes": nbytes, "transfer_s": seconds}), 4.5e11)
    assert fit["slope_fitted"] and fit["bandwidth"] == pytest.approx(3e11, rel=0.05)
    assert fit["fit_p50_s"] == pytest.approx(fit["measured_p50_s"], rel=0.02)
    # a latency the line would make negative: none, and the median transfer's bandwidth
    fit = fit_link(pd.DataFrame({"transfer_bytes": [1e8, 2e8, 3e8], "transfer_s": [1e-3, 1e-3, 3e-3]}), 4.5e11)
    assert fit["latency_s"] == 0 and not fit["slope_fitted"] and fit["bandwidth"] == pytest.approx(2e11)


def test_measured_goodput_is_bracketed_by_the_last_pass_and_the_first_failure():
    def runs(*pairs):
        return pd.DataFrame({"rate_req_s": [r for r, _ in pairs], "attainment": [a for _, a in pairs]})
    assert measured_goodput(runs((2.0, 0.95), (1.0, 1.0), (3.0, 0.5))) == (2.0, 3.0)
    assert measured_goodput(runs((1.0, 0.5), (2.0, 0.2))) == (0.0, 1.0)
    assert measured_goodput(runs((1.0, 0.95), (2.0, 0.91))) == (2.0, float("inf"))


def test_the_engines_winner_needs_disjoint_goodput_intervals(tmp_path):
    plans = pd.DataFrame({"scenario": ["a", "b"], "winner": ["disaggregated", "aggregated"]})
    goodput = pd.DataFrame({"scenario": ["a", "a", "b", "b"], "mode": ["disaggregated", "aggregated"] * 2,
                            "sim_goodput_req_s": [4.0, 2.0, 4.0, 2.0],
                            "goodput_lo_req_s": [3.6, 1.0, 2.0, 1.8], "goodput_hi_req_s": [5.4, 3.6, 3.0, 2.4]})
    run_disagg.write_direction(plans, goodput, tmp_path)
    direction = pd.read_csv(tmp_path / "direction.csv")
    assert list(direction["engine_winner"]) == ["disaggregated", "unresolved"]
    assert list(direction["confirmed"]) == [True, False] and direction["goodput_aggregated"][0] == "[1, 3.6)"


def test_goodput_with_the_simulator_measured_matches_its_prediction(tmp_path):
    setup = Setup("tiny-qwen3", "cpu", Pools(1, 1), cpu=True, measured="sim")
    scenario = SCENARIOS["qwen3-8b"][0]
    ladder = Ladder(setup, (scenario,), tmp_path, Deadline(600.0), 1.0, 6, 10, 4)
    ladder.blocks = 256
    ladder.sim_goodput = {(scenario.name, "disaggregated"): 40.0, (scenario.name, "aggregated"): 20.0}
    assert ladder.rates(scenario, "disaggregated") == [32.0, 48.0]
    assert ladder.rates(scenario, "aggregated") == [16.0, 24.0]
    ok = ladder._serve(lambda w: ladder.sim_attainment(scenario, "aggregated", w.rate)[1], scenario, "aggregated", 16.0)
    runs = pd.read_csv(tmp_path / "goodput_runs.csv")
    assert ok == (runs["attainment"].iloc[0] >= 0.9) and runs["attainment"].iloc[0] == runs["sim_attainment"].iloc[0]


def _fake_ladder(tmp_path, goodput, limit_s=600.0):
    """A Ladder whose fleets pass a rate exactly when it is at most goodput[mode] (no serving), and
    the first two rates of each served: the Qwen3-8B H200 call's intervals, disagg [3.7, 5.55) and
    aggregated [2.8, 4.2)."""
    setup = Setup("tiny-qwen3", "cpu", Pools(1, 1), cpu=True, measured="sim")
    scenario = SCENARIOS["qwen3-8b"][0]
    ladder = Ladder(setup, (scenario,), tmp_path, Deadline(limit_s), 1.0, 6, 10, 4)
    visits = []

    def serve(_, scenario, mode, rate):
        ladder.runs.append({"scenario": scenario.name, "mode": mode, "rate_req_s": rate,
                            "attainment": 1.0 if rate <= goodput[mode] else 0.5})
        return rate <= goodput[mode]

    ladder._serve = serve
    ladder._fleet = lambda mode: visits.append(mode) or contextlib.nullcontext(None)
    ladder._warm = lambda serve, scenario: None
    for mode, rates in (("disaggregated", (3.7, 5.55)), ("aggregated", (2.8, 4.2))):
        for rate in rates:
            serve(None, scenario, mode, rate)
    return ladder, scenario, visits


@pytest.mark.parametrize("goodput, settled", [
    ({"disaggregated": 4.0, "aggregated": 3.9}, "disaggregated"),
    ({"disaggregated": 3.8, "aggregated": 4.1}, "aggregated"),
    ({"disaggregated": 5.0, "aggregated": 3.0}, "disaggregated"),
    ({"disaggregated": 3.95, "aggregated": 3.95}, "tie within 5%"),
])
def test_goodput_bisects_until_the_fleets_intervals_separate(goodput, settled, tmp_path):
    ladder, scenario, visits = _fake_ladder(tmp_path, goodput)
    ladder._settle(None, scenario, "aggregated")  # the second fleet, right after its first rates
    ladder._settle_visits()
    assert ladder.settled(scenario) == settled
    for mode in goodput:
        lo, hi = ladder.interval(scenario, mode)
        assert lo <= goodput[mode] < hi  # every interval still brackets the fleet's goodput
    assert len(visits) <= 6 and len(ladder.runs) <= 4 + 8
    assert ladder.summary()["settled"].tolist() == [settled, settled]


def test_goodput_settling_stops_at_the_call_budget(tmp_path, capsys):
    ladder, scenario, visits = _fake_ladder(tmp_path, {"disaggregated": 4.0, "aggregated": 3.9}, limit_s=30.0)
    ladder._settle_visits()  # a fleet start (60 s until one is timed) does not fit
    assert visits == [] and ladder.settled(scenario) is None
    assert "no settling visit, out of time" in capsys.readouterr().out


@pytest.mark.parametrize("argv, field", [
    (["measure", "--pools", "0P1D"], "--pools"),
    (["measure", "--workloads", "chat"], "--workloads"),
    (["measure", "--loads", "2"], "--loads"),
    (["measure", "--min-requests", "50", "--max-requests", "10"], "--min-requests"),
    (["goodput", "--model", "qwen3-32b"], "scenarios exist"),
    (["goodput", "--bundle", "results.zip"], "--bundle"),
    (["goodput", "--model", "qwen3-8b", "--scenarios", "both"], "--scenarios"),
])
def test_bad_settings_are_refused_in_one_line(argv, field, tmp_path, capsys):
    assert run_disagg.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and field in err and "\n" not in err


def test_too_few_or_unknown_gpus_are_refused_before_any_gpu_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "detect_gpus", lambda: ["NVIDIA H100 80GB HBM3"] * 2)
    monkeypatch.setattr(run_disagg, "detect_gpus", common.detect_gpus)
    assert run_disagg.main(["measure", "--pools", "2P2D", "--out", str(tmp_path)]) == 2
    assert "needs 4 GPUs, this machine has 2" in capsys.readouterr().err
    assert common.hardware_of(["NVIDIA H200"] * 2, Pools(1, 1)) == "h200"
    with pytest.raises(Exception, match="--hardware"):
        common.hardware_of(["NVIDIA A10G"] * 2, Pools(1, 1))


@pytest.mark.slow
def test_measure_end_to_end_on_cpu_engines(tmp_path):
    from experiments.disagg import fleet_hosts
    from experiments.disagg.kept_steps import LAUNCH_KEPT, read_kept

    argv = ["measure", *SMALL, "--workloads", "long", "--keep-steps", "--out", str(tmp_path)]
    assert run_disagg.main(argv) == 0
    table = pd.read_csv(tmp_path / "compare.csv")
    assert set(table["fleet"]) == {"1P1D", "2x"} and set(table["load"].astype(str)) == {"offline", "0.5", "0.8"}
    moved = pd.read_csv(tmp_path / "transfers.csv")
    assert len(moved) >= 10 and (moved["transfer_s"] > 0).all() and (moved["transfer_bytes"] > 0).all()
    assert (tmp_path / "transfer_fit.csv").is_file() and (tmp_path / "settings.json").is_file()
    # the engine replicas keep a launch log; CPU steps do not overlap, so no launch was recorded
    for path in tmp_path.glob("steps_*.csv.gz"):
        steps = read_kept(path)
        assert set(LAUNCH_KEPT) <= set(steps.columns) and steps["launch_s"].isna().all()
    fleet_hosts.main([str(tmp_path), "--profile", "profiles/h200/qwen3-0.6b.csv"])
    hosts = pd.read_csv(tmp_path / "hosts.csv")
    assert set(hosts["pool"]) == {"prefill", "decode", "aggregated", "fleet"} and hosts["host_scale"].isna().all()


@pytest.mark.slow
def test_goodput_end_to_end_on_cpu_engines(tmp_path):
    assert run_disagg.main(["goodput", *SMALL, "--out", str(tmp_path)]) == 0
    direction = pd.read_csv(tmp_path / "direction.csv")
    assert list(direction["scenario"]) == ["disagg_wins", "agg_wins"]
    assert direction["settled"].isin(["disaggregated", "aggregated", "unresolved"]).all() or \
        direction["settled"].str.startswith("tie").any()
    runs = pd.read_csv(tmp_path / "goodput_runs.csv")
    assert set(runs["fleet"]) == {"1P1D", "2x"} and runs["attainment"].between(0, 1).all()
    assert (tmp_path / "plan_disagg_wins" / "plan_summary.csv").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-0.6b"])
@pytest.mark.parametrize("hardware", ["h100", "h200"])
def test_the_planner_picks_each_scenarios_mode(model, hardware, tmp_path):
    assert run_disagg.main(["plan", "--model", model, "--hardware", hardware, "--out", str(tmp_path)]) == 0
    plans = pd.read_csv(tmp_path / "plan_direction.csv")
    assert list(plans["winner"]) == list(plans["expected"]) == ["disaggregated", "aggregated"]
    disagg_wins = pd.read_csv(tmp_path / "plan_disagg_wins" / "plan_summary.csv").iloc[0]
    assert disagg_wins["disaggregated_deployment"].startswith(f"1P x {hardware} TP 1 + 1D x {hardware} TP 1 (2 GPUs)")
    agg_wins = pd.read_csv(tmp_path / "plan_agg_wins" / "plan_summary.csv").iloc[0]
    assert agg_wins["aggregated_deployment"].startswith(f"2 x {hardware} TP 1 (2 GPUs)")


def test_a_bundle_holds_every_part_written_before_each_log_line(tmp_path, capsys):
    import tarfile

    out, bundle = tmp_path / "out", tmp_path / "ship" / "r.tar.gz"
    out.mkdir()
    bundle.parent.mkdir()
    deadline = Deadline(600.0, (out, bundle))
    (out / "runs.csv").write_text("a\n1\n")
    common.log(deadline, "first part")
    with tarfile.open(bundle) as tar:
        assert tar.getnames() == ["out", "out/runs.csv"]
    (out / "compare.md").write_text("x")
    common.log(deadline, "second part")
    with tarfile.open(bundle) as tar:
        assert sorted(tar.getnames()) == ["out", "out/compare.md", "out/runs.csv"]
    assert [p.name for p in bundle.parent.iterdir()] == ["r.tar.gz"]  # no partial file left
    assert run_disagg.main(["goodput", "--out", str(out), "--bundle", str(out / "in.tar.gz")]) == 2
    assert "outside --out" in capsys.readouterr().err


def test_transfers_by_cell_reads_each_cell_against_its_own_fleets_run():
    from experiments.disagg.h200_run1.transfers_by_cell import summarise

    transfers = pd.DataFrame({"fleet": ["2P2D"] * 4 + ["3P1D"] * 4, "workload": "long", "load": "0.8",
                              "prompt_tokens": [100, 200, 300, 400] * 2, "transfer_bytes": [1e6, 2e6, 3e6, 4e6] * 2,
                              "transfer_s": [0.001, 0.002, 0.003, 0.004] * 2, "transfer_wait_s": 0.001})
    runs = pd.DataFrame({"side": ["measured", "measured", "profiled"], "fleet": ["2P2D", "3P1D", "3P1D"],
                         "workload": "long", "load": "0.8", "tpot_p50_s": [0.002, 0.004, 0.001]})
    table = summarise(transfers, runs)
    assert list(table.tpot_p50_ms) == [2.0, 4.0]  # each mix's measured TPOT, not another fleet's
    assert list(table.transfer_per_step) == [1.25, 0.62]


def test_sim_set_reaches_the_simulated_side_alone(tmp_path):
    """--sim-set carries settings the engine has not (backend.fleet_intake): the simulated side takes
    them, the measured side (the simulator standing in for the engine here) does not."""
    args = run_disagg.parse(["measure", "--cpu", "--dry-run", "--out", str(tmp_path), "--sim-set",
                            "backend.fleet_intake=true"])
    setup = run_disagg.make_setup(args, run_disagg.check(args))
    assert setup.sim_overrides == ("backend.fleet_intake=true",)
    assert setup.run_config("sim").sim.fleet_intake and not setup.run_config("measured").sim.fleet_intake


def test_a_transfer_lands_at_the_first_boundary_only_before_the_second_step_end():
    ends = np.array([0.010, 0.016, 0.022])
    post = np.array([0.011, 0.011, 0.011])
    landed = np.array([0.0168, 0.0228, 0.016])  # a lag after the first end, after the second, at the first
    assert first_boundary(post, landed, ends).tolist() == [True, False, True]


@pytest.mark.parametrize(("hardware", "argv", "expected"), [
    ("h200", [], ("backend.fleet_intake=true", "backend.idle_start=null", "backend.kv_scatter=true")),
    ("h200", ["--sim-set", "backend.idle_start=false"],
     ("backend.fleet_intake=true", "backend.idle_start=null", "backend.kv_scatter=true", "backend.idle_start=false")),
    ("h200", ["--no-host-settings"], ()),
    ("h100", [], ()),  # nothing of the engine fleet's host work measured on this GPU host
])
def test_a_measure_call_prices_the_host_work_its_gpu_host_has_measured(hardware, argv, expected, tmp_path):
    """The fleet's intake and the idle start's host work are priced where they were measured, in the
    call's settings.json (its re-simulation reads them there), and --sim-set after them wins."""
    args = run_disagg.parse(["measure", "--dry-run", "--hardware", hardware, "--out", str(tmp_path),
                             "--no-decode-waves", *argv])
    setup = run_disagg.make_setup(args, run_disagg.check(args))
    assert setup.sim_overrides == expected and tuple(args.sim_overrides) == expected
    sim = setup.run_config("sim").sim
    last = {key: {"true": True, "null": None}.get(value, False)
            for key, value in (setting.split("=") for setting in expected)}
    assert (sim.fleet_intake, sim.idle_start, sim.kv_scatter) == tuple(
        last.get(f"backend.{name}", False) for name in ("fleet_intake", "idle_start", "kv_scatter"))
    assert not setup.run_config("measured").sim.idle_start


@pytest.mark.parametrize("hardware", ["h200", "h100"])
def test_a_measure_call_on_a_gh100_prices_the_decode_kernels_waves_less_the_grids(hardware, tmp_path):
    """On the GH100 die the simulated side prices the decode kernel's waves (5 programs an SM) less
    what the grid's rows hold (grid_waves), after the host work's settings; the engine's side has no
    such settings; --no-decode-waves leaves them out and --sim-set after them wins."""
    def setup_of(*argv: str):
        args = run_disagg.parse(["measure", "--dry-run", "--hardware", hardware, "--out", str(tmp_path),
                                 "--no-host-settings", *argv])
        return run_disagg.make_setup(args, run_disagg.check(args))

    waves = setup_of()
    assert waves.sim_overrides == ("hardware.decode_programs_per_sm=5", "backend.decode_programs_baseline=grid_waves")
    sim = waves.run_config("sim")
    assert sim.hardware.decode_programs_per_sm == 5 and sim.sim.decode_programs_baseline == "grid_waves"
    measured = waves.run_config("measured")
    assert measured.hardware.decode_programs_per_sm is None and measured.sim.decode_programs_baseline == "none"
    assert setup_of("--no-decode-waves").sim_overrides == ()
    over = setup_of("--sim-set", "backend.decode_programs_baseline=grid_spread").run_config("sim").sim
    assert over.decode_programs_baseline == "grid_spread"


def test_the_idle_start_is_left_to_a_profile_whose_lead_fits_price_it(tmp_path):
    """A lead is timed from submit() on an idle device: such a profile holds the idle start's host
    work, so a measure call's idle_start=null prices it only beside a profile without lead fits."""
    leads = tmp_path / "with_leads.csv"
    table = pd.read_csv("profiles/h200/qwen3-0.6b.csv")
    lead = table[table["regime"] == "prefill"].assign(regime="lead:prefill")
    pd.concat([table, lead]).to_csv(leads, index=False)
    args = run_disagg.parse(["measure", "--dry-run", "--hardware", "h200", "--out", str(tmp_path)])
    rc = run_disagg.make_setup(args, run_disagg.check(args)).run_config("sim")
    plain = "profiles/h200/qwen3-0.6b.csv"
    priced = {path: idle_start_s(rc.hardware, rc.sim, True, ProfiledCostModel.load(path)) for path in (plain, leads)}
    assert priced == {plain: rc.hardware.idle_start_host_s, leads: 0.0}


def test_decode_waves_reads_each_variants_tpot_error_against_the_calls_measured_cell(tmp_path):
    call = "h200_06b_run2"
    measured = pd.read_csv(runs_path(kv_scatter.HERE / call), dtype={"load": str})
    cells = measured[(measured.side == "measured") & (measured.load == "0.8")]
    scales = (1.0, 1.1, 0.8, 0.95)
    assert len(scales) == len(decode_waves.VARIANTS)
    for scale, variant in zip(scales, decode_waves.VARIANTS):
        sim = cells.assign(side="sim", tpot_p50_s=cells.tpot_p50_s * scale, tpot_p90_s=cells.tpot_p90_s * scale)
        sim.to_csv(tmp_path / f"{call}__{variant}.csv", index=False)
    table = decode_waves.cell_errors(tmp_path, ((call, "handshake+queue"),))
    assert len(table) == len(scales) * len(cells) and set(table.load) == {"0.8"}
    by_variant = table.groupby("variant")["tpot_p50_s_error_pct"].agg(["min", "max"])
    assert by_variant.loc["+waves"].tolist() == [10.0, 10.0]
    assert by_variant.loc["+waves+grid_spread"].tolist() == [-20.0, -20.0]
    assert by_variant.loc["+waves+grid_waves"].tolist() == [-5.0, -5.0]
