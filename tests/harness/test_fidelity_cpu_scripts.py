"""The CPU scripts that read a held-out call again: cell_table's rows, price_sensitivity's variants
and resimulate's cost-model arguments (the simulations themselves are the fidelity tests')."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.fidelity.cell_table import read_margins, rows
from experiments.fidelity.price_sensitivity import parse_variant, parse_variants, scaled_profile
from experiments.fidelity.resimulate import main as resimulate
from harness.convert import ConfigError
from harness.fidelity.report import PLOTTED


def _cell(errors: list[float], lo: float, hi: float) -> pd.DataFrame:
    return pd.DataFrame({"model": "qwen3-0.6b", "hardware": "H200-SXM-141GB", "cost_model": "carried", "load": 0.5,
                         "metric": list(PLOTTED), "engine": 1.0, "err": errors, "engine_spread": 0.02,
                         "sim_lo": lo, "sim_hi": hi})


def test_a_cell_meets_its_bound_only_when_every_percentile_does():
    within = rows(_cell([0.1, -0.149, 0.0, 0.05], 0.9, 1.1), {}, {"carried": 0.15})[0]
    missed = rows(_cell([0.1, -0.151, 0.0, 0.05], 0.9, 1.1), {}, {"carried": 0.15})[0]
    assert "| yes |" in within and "| no |" in missed
    assert "-15.1% (2.0%)" in missed


def test_a_table_of_several_classes_gets_a_row_per_class():
    cells = pd.concat([_cell([0.05] * 4, 0.9, 1.1).assign(workload="chat"),
                       _cell([0.2] * 4, 0.9, 1.1).assign(workload="code")], ignore_index=True)
    chat, code = rows(cells, {}, {"carried": 0.15})
    assert "| carried | chat | 0.5 |" in chat and "| yes |" in chat
    assert "| carried | code | 0.5 |" in code and "| no |" in code


def test_the_conformal_margin_widens_the_interval_in_log_space(tmp_path):
    # the engine (1.0) lies 5% above hi: outside, and inside once widened by a margin of ln(1.06)
    cell = _cell([0.0] * 4, 0.9, 1 / 1.05)
    assert rows(cell, {("qwen3-0.6b",): math.log(1.06)}, {})[0].endswith("| 0/4, 4/4 |")
    # margins per model, GPU and load (merge.py's file) take the cell's own group; inf: too few cells
    per_group = tmp_path / "margins.csv"
    pd.DataFrame({"model": "qwen3-0.6b", "hardware": "H200-SXM-141GB", "load": ["0.5", "0.8"],
                  "calibration_cells": [18, 6], "conformal_margin": [math.log(1.04), math.inf]}).to_csv(per_group)
    margins = read_margins(per_group)
    assert rows(cell, margins, {})[0].endswith("| 0/4, 0/4 |")
    assert rows(cell.assign(load=0.8), margins, {})[0].endswith("| 0/4, too few cells |")
    per_model = tmp_path / "per_model.csv"
    pd.DataFrame({"model": ["qwen3-0.6b"], "served_cells": [41],
                  "conformal_margin": [math.log(1.06)]}).to_csv(per_model)
    assert rows(cell, read_margins(per_model), {})[0].endswith("| 0/4, 4/4 |")


@pytest.mark.parametrize(("text", "change", "host"), [
    ("all=1.04", (1.04, 1.04, 0.0), None), ("prefill=1.03", (1.03, 1.0, 0.0), None),
    ("decode=0.9", (1.0, 0.9, 0.0), None), ("added=0.0002", (1.0, 1.0, 0.0002), None),
    ("launch:prefill=1.3", (1.0, 1.0, 0.0), ("launch:prefill", 1.3)),
    ("gpu:prefill=1.1", (1.0, 1.0, 0.0), ("gpu:prefill", 1.1)),
    ("knot:decode_graph@4=0.875", (1.0, 1.0, 0.0), ("knot:decode_graph@4", 0.875))])
def test_price_variants_parse_into_step_factors_or_a_host_fit(text, change, host):
    assert parse_variant(text) == (change, host)


@pytest.mark.parametrize("text", ["prefill", "prefill=x", "cpu:prefill=1.1", "both=1.2", "knot:decode_graph=0.9",
                                  "knot:decode_graph@four=0.9", "gpu:prefill=1.1+decode=1.2", "prefill=1.1+all=1.0"])
def test_a_bad_price_variant_is_refused(text):
    with pytest.raises(ConfigError, match="--variants"):
        parse_variants(text)


def test_profile_changes_joined_by_plus_scale_each_fit_in_one_copy(tmp_path):
    profile = "profiles/h200/qwen3-0.6b.csv"
    change, fits = parse_variants("gpu:prefill=1.5+knot:decode_graph@4=0.5")
    assert change == (1.0, 1.0, 0.0) and fits == [("gpu:prefill", 1.5), ("knot:decode_graph@4", 0.5)]
    before = pd.read_csv(profile)
    after = pd.read_csv(scaled_profile(profile, fits, tmp_path))
    ratio = after["value"] / before["value"]
    device = (before["regime"] == "gpu:prefill") & before["kind"].isin(["knot", "linear"]) & (before["value"] != 0)
    knot = (before["regime"] == "decode_graph") & (before["kind"] == "knot") & (before["x"] == 4.0)
    assert device.any() and ratio[device].to_numpy() == pytest.approx(1.5)
    assert ratio[knot].to_numpy() == pytest.approx([0.5])
    assert (before["value"][~(device | knot)] == after["value"][~(device | knot)]).all()


def test_a_knot_variant_scales_that_knot_alone(tmp_path):
    profile = "profiles/h200/qwen3-0.6b.csv"
    before = pd.read_csv(profile)
    after = pd.read_csv(scaled_profile(profile, [("knot:decode_graph@4", 0.5)], tmp_path))
    changed = before["value"] != after["value"]
    assert changed.sum() == 1
    row = before[changed].iloc[0]
    assert (row["regime"], row["kind"], row["x"]) == ("decode_graph", "knot", 4.0)
    assert after.loc[changed, "value"].iloc[0] == pytest.approx(0.5 * row["value"])
    with pytest.raises(ConfigError, match="knot:decode_graph@3"):
        scaled_profile(profile, [("knot:decode_graph@3", 0.5)], tmp_path)


def test_resimulate_wants_a_profile_for_profiled_and_none_for_the_roofline(tmp_path, capsys):
    common = ["--label", "x", "--model", "qwen3-0.6b", "--hardware", "h200", "--num-blocks", "10",
              "--num-requests", "3", "--out", str(tmp_path / "o.csv")]
    assert resimulate([str(tmp_path / "t.csv"), *common]) == 2
    assert resimulate([str(tmp_path / "t.csv"), "p.csv", "--cost-model", "roofline", *common]) == 2
    assert capsys.readouterr().err.count("error: profile:") == 2


def test_resimulate_refuses_a_bad_interval_seed_or_machine_spread_in_one_line(tmp_path, capsys):
    common = ["p.csv", "--label", "x", "--model", "qwen3-0.6b", "--hardware", "h100", "--num-blocks", "10",
              "--num-requests", "3", "--interval", "--out", str(tmp_path / "o.csv")]
    assert resimulate([str(tmp_path / "t.csv"), *common, "--interval-seed", "-1"]) == 2
    assert resimulate([str(tmp_path / "t.csv"), *common, "--machine-spread", "1.5"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: --interval-seed must be an int >= 0, got -1",
                   "error: --machine-spread must be null or in [0, 1), got 1.5"]


def test_refit_profile_refuses_expected_experts_of_a_grid_without_them(tmp_path, capsys):
    from experiments.fidelity.refit_profile import main as refit

    grid = tmp_path / "profile.csv"
    pd.DataFrame({"set": ["grid"], "duration_s": [0.01], "num_tokens": [1]}).to_csv(grid, index=False)
    assert refit([str(grid), "--experts", "expected", "--out", str(tmp_path / "out")]) != 0
    assert "moe_expected_experts" in capsys.readouterr().err


def test_refit_profile_at_a_locality_needs_the_model_and_fit_locality_a_grid_with_counts(tmp_path, capsys):
    from experiments.fidelity.fit_locality import main as fit
    from experiments.fidelity.refit_profile import main as refit

    grid = tmp_path / "profile.csv"
    pd.DataFrame({"set": ["grid"], "duration_s": [0.01], "num_tokens": [1],
                  "moe_expected_experts": [8.0]}).to_csv(grid, index=False)
    assert refit([str(grid), "--experts", "expected", "--moe-routing-locality", "2", "--out", str(tmp_path)]) != 0
    assert "--model" in capsys.readouterr().err
    bare = tmp_path / "bare.csv"
    pd.DataFrame({"set": ["grid"], "duration_s": [0.01]}).to_csv(bare, index=False)
    assert fit([str(bare), "--model", "qwen3-30b-a3b", "--moe-routing-skew", "0", "--out", str(tmp_path)]) != 0
    assert "moe_expected_experts" in capsys.readouterr().err


def test_resimulated_rows_carry_the_host_they_were_priced_at_and_never_the_tables(tmp_path):
    """--host-scales: each cell's host_scale is the mean of its repeats' hosts (the table's own host
    columns are not copied into the new rows); without it, no host_scale column."""
    from experiments.fidelity.resimulate import resimulate as rerun

    cell = {"model": "qwen3-0.6b", "hardware": "H100-SXM5-80GB", "workload": "decode_heavy", "load": "offline",
            "metric": "ttft_p50_s", "engine": 0.05, "cost_model": "profiled", "rate_req_s": float("nan"),
            "host_scale": 9.0, "host_measured": True}
    table = pd.DataFrame([cell])
    args = (table, "experiments/fidelity/h100_leakfree/profile_model.csv", "x", ["model=qwen3-0.6b", "hardware=h100",
                                                                                 "backend=sim"], 2422, 3, None)
    hosted = rerun(*args, host_scales={("decode_heavy", "offline"): [(1.5, 0.0), (2.0, 0.0)]})
    assert hosted["host_scale"].tolist() == [1.75] and "host_measured" not in hosted
    assert "host_scale" not in rerun(*args)


def test_a_device_scale_prices_the_loaded_cells_and_leaves_the_drain_the_profiles_gpu():
    """--device-scale: a loaded cell is simulated on the slower GPU (longer TTFT), the drain, which
    measured it, on the profile's; each row says what it was priced at, never the table's."""
    from experiments.fidelity.resimulate import resimulate as rerun

    cells = [{"model": "qwen3-0.6b", "hardware": "H100-SXM5-80GB", "workload": "decode_heavy", "load": load,
              "metric": "ttft_p50_s", "engine": 0.05, "cost_model": "profiled", "rate_req_s": rate,
              "device_scale": 9.0} for load, rate in (("offline", float("nan")), ("0.8", 4.0))]
    args = (pd.DataFrame(cells), "experiments/fidelity/h100_leakfree/profile_model.csv", "x",
            ["model=qwen3-0.6b", "hardware=h100", "backend=sim"], 2422, 4, None)
    base, slower = rerun(*args), rerun(*args, device_scale=1.2)
    assert "device_scale" not in base
    assert slower["device_scale"].tolist() == [1.0, 1.2]
    assert slower["sim"].iloc[0] == base["sim"].iloc[0]
    assert slower["sim"].iloc[1] > 1.1 * base["sim"].iloc[1]


def test_padded_steps_split_decode_graphs_by_padding_and_refuse_bad_input(tmp_path, capsys):
    from experiments.fidelity.padded_steps import decode_graphs
    from experiments.fidelity.padded_steps import main as padded_steps

    replay = pd.DataFrame({"step": range(4), "kind": ["decode", "decode", "decode", "prefill"],
                           "num_seqs": [3, 4, 3, 1], "cuda_graph": [1, 1, 0, 1], "graph_batch_size": [4, 4, 3, 512],
                           "measured_s": [8e-3, 8e-3, 7e-3, 0.02], "predicted_profiled_s": [7e-3, 8e-3, 7e-3, 0.02],
                           "predicted_repriced_s": [8e-3, 8e-3, 7e-3, 0.02]})
    table = decode_graphs(replay, "profiled")
    assert list(table.index) == [(4, False), (4, True)]  # the eager decode and the prefill are left out
    assert table.loc[(4, True), "err_replay"] == pytest.approx(-0.125)
    assert table.loc[(4, True), "err_repriced"] == pytest.approx(0.0)
    profile = str(tmp_path / "model.csv")
    assert padded_steps([profile, str(tmp_path / "none.csv.gz"), "--model", "qwen3-30b-a3b",
                         "--moe-routing-skew", "0.4"]) == 2
    assert "no such replay file" in capsys.readouterr().err
    assert padded_steps([profile, str(tmp_path / "none.csv.gz"), "--model", "qwen3-0.6b",
                         "--moe-routing-skew", "0.4"]) == 2
    assert "dense" in capsys.readouterr().err


def test_prefill_rows_price_a_grids_prefill_graphs_by_its_device_time_fit(tmp_path):
    """A grid whose prefill graphs took 1 ms plus 1 us a padded token, fresh or after a cached
    context: its own fit prices every row as measured; a grid that does not separate the cached
    context's cost prices fresh rows above what they took (what cause/prefill_rows shows)."""
    import numpy as np

    from experiments.fidelity.cause.prefill_rows import main, prefill_rows
    from sim.profiled import ProfiledCostModel

    sizes = np.repeat([16, 64, 256, 512, 1024], 4)
    context = np.tile([0, 0, 512, 512], 5)
    grid = pd.DataFrame({"num_prefill_tokens": sizes, "num_decode_tokens": 0, "num_seqs": 1, "num_sampled": 1,
                         "prefill_context_tokens": context, "decode_context_tokens": 0, "cuda_graph": 1,
                         "graph_batch_size": sizes, "launch_s": 5e-4})
    grid["prefill_attention_pairs"] = sizes * context + sizes * (sizes + 1) // 2
    grid["gpu_s"] = grid["duration_s"] = 1e-3 + 1e-6 * sizes + 1e-12 * grid["prefill_attention_pairs"]
    rows = prefill_rows(grid, ProfiledCostModel.fit(grid))
    assert len(rows) == len(grid) and np.abs(rows["error"]).max() < 1e-9
    # the cached context costs 0.4 ms more than its attention pairs say: the fit cannot tell
    slow = grid.assign(gpu_s=grid["gpu_s"] + 4e-4 * (grid["prefill_context_tokens"] > 0))
    rows = prefill_rows(slow, ProfiledCostModel.fit(slow.assign(duration_s=slow["gpu_s"])))
    small, fresh = rows["graph_batch_size"] <= 256, rows["context_per_seq"] == 0
    assert (rows.loc[small & fresh, "error"] > 0.03).all() and (rows.loc[small & ~fresh, "error"] < -0.03).all()
    grid.drop(columns=["launch_s", "gpu_s"]).to_csv(tmp_path / "plain.csv", index=False)
    with pytest.raises(SystemExit, match="no device-time fit"):
        main([str(tmp_path / "plain.csv"), str(tmp_path / "plain.csv"), "--out", str(tmp_path / "out.csv")])


def test_resimulate_refuses_an_unknown_repeated_reads_rule(tmp_path, capsys):
    common = ["--label", "x", "--model", "qwen3-0.6b", "--hardware", "h100", "--num-blocks", "10",
              "--num-requests", "3", "--out", str(tmp_path / "o.csv")]
    with pytest.raises(SystemExit):
        resimulate([str(tmp_path / "t.csv"), "p.csv", "--repeated-reads", "linear", *common])
    assert "--repeated-reads: invalid choice: 'linear'" in capsys.readouterr().err


def test_prefill_rows_price_a_grids_eager_rows_by_their_token_count():
    """--regime prefill: the eager rows (past the prefill graphs), sized by their tokens, priced by
    gpu:prefill; a grid timed as its fit says is priced as measured; an unknown regime is refused."""
    import numpy as np

    from experiments.fidelity.cause.prefill_rows import prefill_rows
    from sim.profiled import ProfiledCostModel

    sizes = np.repeat([4096, 8192, 12288, 16384], 4)
    seqs = np.tile([1, 4, 16, 32], 4)
    grid = pd.DataFrame({"num_prefill_tokens": sizes, "num_decode_tokens": 0, "num_seqs": seqs, "num_sampled": seqs,
                         "prefill_context_tokens": 0, "decode_context_tokens": 0, "cuda_graph": 0,
                         "graph_batch_size": seqs, "launch_s": 1e-2})
    grid["prefill_attention_pairs"] = seqs * (sizes // seqs) * (sizes // seqs + 1) // 2
    grid["gpu_s"] = grid["duration_s"] = 2e-3 + 2e-6 * sizes + 1e-13 * grid["prefill_attention_pairs"]
    rows = prefill_rows(grid, ProfiledCostModel.fit(grid), "prefill")
    assert "graph_batch_size" not in rows.columns and list(rows["num_prefill_tokens"]) == sorted(sizes)
    assert np.abs(rows["error"]).max() < 1e-6
    with pytest.raises(ValueError, match="regime"):
        prefill_rows(grid, ProfiledCostModel.fit(grid), "decode_graph")


def _replay(path, steps: list[tuple[int, int, float]]) -> None:
    """A step replay of (step, new prefill tokens, measured seconds) rows, decode steps between."""
    rows = [{"step": i, "num_seqs": 4, "num_prefill_tokens": 0, "cuda_graph": 1, "measured_s": 1e-3,
             "launch_s": 5e-4, "predicted_profiled_s": 1e-3} for i in range(30)]
    for step, tokens, seconds in steps:
        rows[step].update(num_prefill_tokens=tokens, cuda_graph=0, measured_s=seconds, predicted_profiled_s=0.03)
    pd.DataFrame(rows).to_csv(path, index=False)


def test_burst_phase_reads_whether_each_engine_run_prefilled_the_burst_in_one_step(tmp_path):
    """The engine's burst steps from its replays: a burst in one step of its tokens in every run
    gives their mean time; a run that cut it in two lists both parts and gives none; a prefill
    far from the largest is not the burst's."""
    from experiments.fidelity.cause.burst_phase import engine_burst

    _replay(tmp_path / "a.csv.gz", [(2, 300, 0.01), (10, 1000, 0.02), (11, 50, 0.002)])
    _replay(tmp_path / "b.csv.gz", [(10, 1000, 0.03)])
    _replay(tmp_path / "c.csv.gz", [(10, 600, 0.015), (12, 450, 0.012)])
    lines, seconds = engine_burst([tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"], 1000)
    assert seconds == pytest.approx(0.025)
    assert "step 10: 4 sequences, 1000 new tokens, eager, 20.00 ms" in lines[0] and "step 11:" in lines[0]
    assert "step 2:" not in lines[0]
    lines, seconds = engine_burst([tmp_path / "a.csv.gz", tmp_path / "c.csv.gz"], 1000)
    assert seconds is None and "600 new tokens" in lines[1] and "450 new tokens" in lines[1]


def test_a_repriced_burst_step_takes_the_engines_time_and_leaves_every_other_step():
    """Repriced prices a step of exactly the burst's new tokens at the given seconds; the inner
    model still prices every step (its state follows the run) and keeps every other price."""
    from types import SimpleNamespace

    from experiments.fidelity.cause.burst_phase import Repriced

    class Inner:
        calls = 0

        def step_time(self, plan) -> float:
            self.calls += 1
            return 1e-3 * plan.stats.num_prefill_tokens

        def drained(self) -> None:
            pass

    inner = Inner()
    cost = Repriced(inner, 1000, 0.5)
    plans = [SimpleNamespace(stats=SimpleNamespace(num_prefill_tokens=n)) for n in (1000, 999, 0)]
    assert [cost.step_time(p) for p in plans] == [0.5, 0.999, 0.0] and inner.calls == 3


def test_price_sensitivity_at_two_hosts_is_the_mean_of_each_host_alone():
    """--host-scales: a cell served by two engine repeats on hosts of speed 1 and 3 is priced at
    each and averaged, as the held-out table prices it; a slower host moves the prediction."""
    from experiments.fidelity.price_sensitivity import sensitivity

    table = pd.DataFrame({"model": "qwen3-0.6b", "hardware": "H200-SXM-141GB", "workload": "prefill_heavy",
                          "load": "0.5", "metric": list(PLOTTED), "engine": 0.05, "rate_req_s": 2.0,
                          "cost_model": "profiled"})
    overrides = ["model=qwen3-0.6b", "hardware=h200", "backend=sim"]

    def sim(hosts):
        result = sensitivity(table, "profiles/h200/qwen3-0.6b.csv", overrides, 4418, 6, ["prefill=1.1"],
                             {("prefill_heavy", "0.5"): [(h, 0.0) for h in hosts]})
        return result.set_index(["variant", "metric"])["sim"]

    one, three, both = sim([1.0]), sim([3.0]), sim([1.0, 3.0])
    assert (three != one).any()
    assert both.to_numpy() == pytest.approx(((one + three) / 2).to_numpy(), rel=1e-12)


def test_host_scales_reads_the_drains_device_scale_off_its_steps_at_its_host(tmp_path, capsys):
    """A drain whose steps ran 1.1x their price at the run's host (launches at the profile's: host 1)
    gives device_scale 1.1 for the class; a loaded cell gets none (its own runs are what it predicts)."""
    from experiments.fidelity.cause.host_scales import main as host_scales_main
    from experiments.fidelity.cause.host_scales import replay_steps
    from sim.features import step_features
    from sim.profiled import ProfiledCostModel
    from tests.sim.helpers import decode_batch, plan, prefill
    from tests.sim.test_profiled import GRAPH
    from tests.sim.test_profiled_overlap import LAUNCH_DECODE, LAUNCH_PREFILL, overlapping_profile

    profile = tmp_path / "profile.csv"
    ProfiledCostModel.fit(overlapping_profile(), GRAPH).to_csv(profile)
    model = ProfiledCostModel.load(profile)
    # device-bound steps, whose price does not depend on what ran before them
    plans = [decode_batch([2048 + i for i in range(n)]) for n in (8, 64, 200)] + [plan(prefill(16384))]
    rows = [{**step_features(p, GRAPH), "step": i, "launch_s": LAUNCH_PREFILL if i == 3 else LAUNCH_DECODE}
            for i, p in enumerate(plans * 5)]
    steps_dir = tmp_path / "steps"
    steps_dir.mkdir()
    for load, factor in (("offline", 1.1), ("0.8", 1.3)):
        table = pd.DataFrame(rows).assign(measured_execute_s=0.0)
        path = steps_dir / f"code_completion_{load}_0.csv.gz"
        table.to_csv(path, index=False)
        priced = model.predict(replay_steps(path))
        table.assign(measured_execute_s=factor * priced).to_csv(path, index=False)
    assert host_scales_main([str(steps_dir), str(profile), "--out", str(tmp_path / "hs")]) == 0
    cells = pd.read_csv(tmp_path / "hs.csv").set_index("load")
    assert cells.loc["offline", "host_scale"] == pytest.approx(1.0, rel=1e-6)
    assert cells.loc["offline", "device_scale"] == pytest.approx(1.1, rel=1e-6)
    assert math.isnan(cells.loc["0.8", "device_scale"])
    runs = pd.read_csv(tmp_path / "hs_runs.csv").set_index("load")
    assert runs.loc["0.8", "device_scale"] == pytest.approx(1.3, rel=1e-6)


def test_resimulate_captures_the_prefill_graphs_the_call_set_and_refuses_a_bad_size(tmp_path, capsys):
    """--prefill-graph-tokens: a call that replayed prefill graphs to 16,384 tokens is simulated with
    them (prompts of 4-8k tokens priced as graph steps, not eager ones); a negative size is refused."""
    from experiments.fidelity.resimulate import resimulate as rerun

    cell = {"model": "qwen3-0.6b", "hardware": "H100-SXM5-80GB", "workload": "prefill_heavy", "load": "offline",
            "metric": "ttft_p50_s", "engine": 0.05, "cost_model": "profiled", "rate_req_s": float("nan")}
    base = ["model=qwen3-0.6b", "hardware=h100", "backend=sim"]
    args = (pd.DataFrame([cell]), "experiments/fidelity/h100_leakfree/profile_model.csv", "x")
    default = rerun(*args, base, 2422, 4, None)
    graphs = rerun(*args, [*base, "execution.prefill_graph_tokens=16384"], 2422, 4, None)
    assert graphs["sim"].iloc[0] != pytest.approx(default["sim"].iloc[0], rel=1e-3)
    common = ["p.csv", "--label", "x", "--model", "qwen3-0.6b", "--hardware", "h100", "--num-blocks", "10",
              "--num-requests", "3", "--prefill-graph-tokens", "-1", "--out", str(tmp_path / "o.csv")]
    pd.DataFrame([cell]).to_csv(tmp_path / "t.csv", index=False)
    capsys.readouterr()
    assert resimulate([str(tmp_path / "t.csv"), *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prefill_graph_tokens" in err[0]
