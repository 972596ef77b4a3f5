"""experiments/fidelity/cause/host_parts.py: a replay priced under each rule of which host parts
follow the serving host, by kind of step, and the lead probe. The replay here is made by the rule
sim.host_speed implements (launches x s, the lead kept), so that rule prices it exactly and the
others do not."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from experiments.fidelity.cause.host_parts import main, run_rows
from sim.host_speed import with_host_scale
from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from sim.step_table import complete_columns

PROFILE = "experiments/fidelity/h100_leakfree/profile_model.csv"
SCALE = 1.6


def step_row(kind: str, tokens: int, graph: int, seqs: int = 1, context: int = 0) -> dict:
    prefill = kind == "prefill"
    return {"kind": kind, "num_tokens": tokens, "num_prefill_tokens": tokens if prefill else 0,
            "num_decode_tokens": 0 if prefill else tokens, "num_seqs": seqs, "num_sampled": seqs,
            "num_seeded": seqs, "cuda_graph": int(graph > 0), "graph_batch_size": graph or tokens,
            "prefill_attention_pairs": tokens * (tokens + 1) // 2 if prefill else 0,
            "decode_context_tokens": context, "prefill_context_tokens": 0}


def served_replay(model: ProfiledCostModel) -> pd.DataFrame:
    """Steps as a host SCALE times slower serves them under sim.host_speed's rule, the second after
    the loop slept: measured_execute_s each priced behind the one before (the first, as a replay
    prices it, behind a repeat of itself), launch_s the host's."""
    graph, eager, decode = step_row("prefill", 2000, 2048), step_row("prefill", 6000, 0), \
        step_row("decode", 8, 8, seqs=8, context=16000)
    shapes = [decode] + [graph, graph, graph, decode, decode, graph, eager, decode, eager, eager, decode, graph] * 3
    table = complete_columns(pd.DataFrame(shapes).assign(duration_s=1.0)).drop(columns="duration_s")
    table = table.assign(step=range(1, len(table) + 1), slept_s=[0.0, 0.1] + [0.0] * (len(table) - 2))
    served = with_host_scale(model, SCALE)
    measured = [float(served.predict(table.iloc[[0]])[0])]
    for i in range(1, len(table)):
        # behind the step before it, or behind nothing (0 s) after the loop slept
        before = 0.0 if table["slept_s"].iloc[i] > 0 else measured[-1]
        pair = table.iloc[[i - 1, i]].assign(previous_duration_s=[0.0, before])
        measured.append(float(served.predict(pair)[-1]))
    launches = [served.overlap_parts(row)[0] for row in table.to_dict("records")]
    return table.assign(measured_execute_s=measured, launch_s=launches)


@pytest.fixture(scope="module")
def priced(tmp_path_factory):
    model = ProfiledCostModel.load(PROFILE)
    path = tmp_path_factory.mktemp("replays") / "code_completion_0.8_0.csv.gz"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        served_replay(model).to_csv(path, index=False)
        rows, probe = run_rows(path, model, "test")
    return path, pd.DataFrame(rows).set_index(["rule", "kind"])["err"], probe


def test_the_rule_that_made_the_replay_prices_every_kind_exactly(priced):
    _, err, probe = priced
    assert probe["host_scale"] == pytest.approx(SCALE, rel=1e-9)
    assert err["no_lead"].abs().max() < 1e-9
    assert err["launch"].abs().max() < 1e-9  # no host fit and no launch delay in this profile


def test_the_other_rules_miss_where_their_part_matters(priced):
    _, err, _ = priced
    assert err["all", "prefill graph, after idle"] > 0.05  # the lead scaled: longer than served
    assert err["all", "prefill graph, after decode"] > 0.05
    assert err["grid", "eager prefill, after prefill"] < -0.03  # launch-bound, at the grid's launches
    assert err["grid", "decode graph, after decode"] == pytest.approx(0.0, abs=1e-9)  # device-bound


def test_the_lead_probe_reads_the_lead_the_replay_waited(priced):
    _, _, probe = priced
    assert probe["idle_prefill_graphs"] == 1
    assert probe["gpu_err"] == pytest.approx(0.0, abs=1e-9)
    assert probe["lead_ratio"] == pytest.approx(1.0, rel=1e-6)
    assert probe["launch_ratio_prefill"] == pytest.approx(SCALE, rel=1e-9)


def test_the_summary_and_a_bad_call_are_one_liners(priced, tmp_path, capsys):
    path, _, _ = priced
    assert main([str(path.parent), PROFILE, "--call", "t", "--out", str(tmp_path / "parts")]) == 0
    assert main(["--summary", str(tmp_path / "parts.csv"), "--min-steps", "1", "--out", str(tmp_path / "s.csv")]) == 0
    summary = pd.read_csv(tmp_path / "s.csv")
    assert set(summary["rule"]) == {"grid", "all", "launch", "no_lead", "own_launch"}
    assert main([str(path.parent), PROFILE, "--out", str(tmp_path / "x")]) == 2
    assert "--call" in capsys.readouterr().err
