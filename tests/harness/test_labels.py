"""Plots say what ran (model, hardware, workload, policy), give units and readable metric names,
and draw no empty panel; compare.md's tables stay tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.compare import plots as compare_plots
from harness.compare.tables import markdown, schedule_table, targets
from harness.config import build_run_config
from harness.labels import metric_label, run_title, table_title
from harness.output.plots import plot_latency_cdfs, plot_sweep, plot_timeline
from harness.run import run_once
from tests.harness.conftest import compose_config

IDENTITY = {"model": "Qwen3-8B", "hardware": "H100-SXM", "workload": "bench", "policy": "mixed"}


@pytest.mark.parametrize("column, label", [
    ("ttft_p90_s", "TTFT P90 (s)"), ("tpot_p50_s", "TPOT P50 (s)"), ("e2e_mean_s", "E2E mean (s)"),
    ("output_tok_s", "output throughput (tok/s)"), ("preemptions", "preemptions (count)"),
    ("prefix_hit_rate", "prefix-cache hit rate (fraction)"), ("ttft_p95_s", "TTFT P95 (s)"),
    ("capacity_req_s", "capacity (req/s)"),
])
def test_metric_labels_are_readable_with_units(column, label):
    assert metric_label(column) == label


def _visible_axes(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def _title(fig) -> str:
    return fig._suptitle.get_text()


def test_sweep_plot_names_the_run_and_skips_metrics_zero_everywhere(tmp_path):
    table = pd.DataFrame({"value": [1, 2, 3], "output_tok_s": [10.0, 20.0, 30.0], "ttft_p90_s": [0.1, 0.2, 0.4],
                          "preemptions": [0, 0, 0], **{k: [v] * 3 for k, v in IDENTITY.items()}})
    fig = plot_sweep(table, "value", ("output_tok_s", "ttft_p90_s", "preemptions"), tmp_path / "s.png",
                     xlabel="cache.num_blocks", title="Sweep of cache.num_blocks")
    axes = _visible_axes(fig)
    assert [ax.get_ylabel() for ax in axes] == ["output throughput (tok/s)", "TTFT P90 (s)"]
    assert all(ax.has_data() for ax in axes)
    title = _title(fig)
    assert all(value in title for value in IDENTITY.values()) and "preemptions (count): 0 in every run" in title


def test_sweep_over_a_group_says_which_field_varies(tmp_path):
    table = pd.DataFrame({"value": ["nano", "mixed"], "output_tok_s": [1.0, 2.0],
                          **{k: [v, v] for k, v in IDENTITY.items() if k != "policy"}, "policy": ["nano", "mixed"]})
    fig = plot_sweep(table, "value", ("output_tok_s",), tmp_path / "s.png")
    assert "policy (varies)" in _title(fig) and "Qwen3-8B on H100-SXM" in _title(fig)


def test_run_plots_carry_the_run_identity_and_units(tmp_path):
    rc = build_run_config(compose_config(["workload.num_requests=8"]))
    outcome = run_once(rc, progress=False)
    timeline = plot_timeline(outcome.steps, outcome.num_blocks, tmp_path / "t.png", outcome.summary)
    expected = run_title(outcome.summary)
    assert expected == f"{rc.model.name} on {rc.hardware.name}, workload bench, policy nano"
    assert expected in _title(timeline)
    assert [ax.get_ylabel() for ax in timeline.axes] == ["KV cache used (%)", "requests (count)"]
    cdfs = plot_latency_cdfs(outcome.requests, tmp_path / "c.png", expected)
    assert expected in _title(cdfs) and cdfs.axes[0].get_ylabel() == "fraction of requests (0-1)"
    assert [ax.get_xlabel() for ax in cdfs.axes] == ["TTFT (s)", "TPOT (s)", "end-to-end (s)"]


def test_compare_metrics_plot_draws_no_empty_panel(tmp_path):
    rows = [{"metric": m, "engine": 1.0, "sim_roofline": 1.1}
            for _, metrics in compare_plots.PANELS for m in metrics]
    table = pd.DataFrame(rows)
    table.loc[table["metric"].isin(["preemptions", "recomputed_tokens"]), ["engine", "sim_roofline"]] = 0.0
    fig = compare_plots.plot_metrics(table, ["engine", "sim_roofline"], tmp_path / "m.png", run_title(IDENTITY))
    ylabels = [ax.get_ylabel() for ax in _visible_axes(fig)]
    assert ylabels == ["throughput (tok/s)", "TTFT (s)", "TPOT (s)", "E2E (s)"]
    assert "preemptions: 0 in every run" in _title(fig) and "Qwen3-8B" in _title(fig)
    assert "TTFT P90" in [t.get_text() for t in fig.axes[1].get_xticklabels()]


def test_table_title_of_one_run_is_its_run_title():
    assert table_title(pd.DataFrame([IDENTITY]), "Report") == "Report: " + run_title(IDENTITY)


def _pipes(line: str) -> int:
    return line.replace("\\|", "").count("|")


def test_markdown_escapes_pipes_in_cells():
    text = markdown(pd.DataFrame({"target": ["|err x| < 5%", "plain"], "value": [0.1, np.nan]}))
    lines = text.splitlines()
    assert {_pipes(line) for line in lines} == {3}  # every row has the header's cells
    assert "\\|err x\\| < 5%" in text


def test_compare_targets_read_as_words():
    steps = pd.DataFrame({"schedule_hash": ["a", "b", "c"], "start": [0.0, 1.0, 2.0], "preempted": [0, 0, 0]})
    diverged = steps.assign(schedule_hash=["a", "x", "c"])
    schedule = schedule_table(steps, {"sim_same": steps, "sim_other": diverged})
    errors = {"metric": ["input_tok_s", "output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s"]}
    table = pd.DataFrame({**errors, "err_sim_same": [0.01] * 6, "err_sim_other": [-0.2] * 6})
    result = targets(table, schedule, offline=True, throughput_tol=0.05, latency_tol=0.1)
    identical = result[result["target"] == "schedule identical"].set_index("run")
    assert identical.loc["sim_same", "value_is"] == "all 3 steps identical"
    assert np.isnan(identical.loc["sim_same", "value"])
    assert identical.loc["sim_other", "value_is"] == "first divergent step (0-based): 1"
    assert identical.loc["sim_other", "value"] == 1 and not identical.loc["sim_other", "met"]
    throughput = result[result["target"] == "output_tok_s within 5% of the engine"].set_index("run")
    assert throughput.loc["sim_other", "value"] == pytest.approx(0.2) and not throughput.loc["sim_other", "met"]
    text = markdown(result)
    assert "-1" not in text and {_pipes(line) for line in text.splitlines()} == {len(result.columns) + 1}
