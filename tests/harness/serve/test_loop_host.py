"""experiments/serve/loop_host.py: the engine server's step table cut into the benchmark's cases and
set against the harness loop's, by decode batch size."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from experiments.serve.loop_host import compare, report, split_server


def steps(seqs: list[int], launch_s: float, period_s: float, first_sleep: float,
          loop_s: float | None = None) -> pd.DataFrame:
    n = len(seqs)
    frame = pd.DataFrame({"start": first_sleep + period_s * np.arange(n), "kind": "decode", "cuda_graph": 1,
                          "num_seqs": seqs, "launch_s": launch_s, "slept_s": [first_sleep] + [0.0] * (n - 1)})
    return frame if loop_s is None else frame.assign(loop_s=loop_s)


def test_the_servers_steps_are_cut_at_the_pauses_between_cases_in_the_plans_order():
    served = pd.concat([steps([1] * 5, 1e-3, 2e-3, 30.0), steps([40] * 4, 1e-3, 2e-3, 20.0)], ignore_index=True)
    cases = split_server(served, ["a_50", "b_50"])
    assert [len(cases["a_50"]), len(cases["b_50"])] == [5, 4] and (cases["b_50"]["num_seqs"] == 40).all()
    with pytest.raises(SystemExit, match="show 2 cases .* the harness's plan 3"):
        split_server(served, ["a_50", "b_50", "c_50"])


def test_each_batch_size_compares_launch_period_and_the_loops_own_work():
    server = steps([3] * 6 + [40] * 6, 1.5e-3, 3e-3, 10.0, loop_s=1.2e-3)
    harness = steps([3] * 6 + [40] * 6, 1e-3, 2.5e-3, 0.0, loop_s=0.6e-3)
    table = compare(server, harness).set_index("seqs")
    assert list(table.index) == ["3-4", "33-64"]
    row = table.loc["33-64"]
    # the last step of each table has no next one and is left out
    assert row["server_steps"] == 5 and table.loc["3-4", "harness_steps"] == 6
    assert row["launch_pct"] == pytest.approx(50) and row["period_pct"] == pytest.approx(20)
    assert row["server_rest"] == pytest.approx(1.5) and row["loop_pct"] == pytest.approx(100)
    assert "server_loop" not in compare(server.drop(columns="loop_s"), harness).columns  # older tables


def test_report_reads_a_bench_output(tmp_path):
    out = tmp_path / "serve"
    (out / "harness" / "a_50").mkdir(parents=True)
    (out / "engine_server").mkdir()
    overrides = ["model=qwen3-0.6b", "hardware=h100", "workload=poisson"]
    (out / "harness" / "plan.json").write_text(json.dumps([{"out": "x/a_50", "overrides": overrides}]))
    steps([2] * 8, 1e-3, 2e-3, 0.0).to_csv(out / "harness" / "a_50" / "steps.csv.gz", index=False)
    steps([2] * 8, 1.2e-3, 2.2e-3, 5.0).to_csv(out / "engine_server" / "steps.csv.gz", index=False)
    text = report(out, None)
    assert "## a_50" in text and "| 1-2 | 7 |" in text


def test_report_refuses_tables_of_steps_that_did_not_overlap(tmp_path):
    out = tmp_path / "serve"
    (out / "harness" / "a_50").mkdir(parents=True)
    (out / "engine_server").mkdir()
    (out / "harness" / "plan.json").write_text(json.dumps([{"out": "x/a_50", "overrides": []}]))
    for path in (out / "harness" / "a_50" / "steps.csv.gz", out / "engine_server" / "steps.csv.gz"):
        steps([2] * 4, 1e-3, 2e-3, 5.0).drop(columns="launch_s").to_csv(path, index=False)
    with pytest.raises(SystemExit, match="a_50: a step table without launch_s"):
        report(out, None)
