"""experiments/fidelity/step_groups.py: a replay's steps grouped by kind and batch, with sums that
add up and errors that are the groups' own (predicted / measured - 1), and bad inputs refused."""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.fidelity.step_groups import main, step_groups


def replay() -> pd.DataFrame:
    return pd.DataFrame({
        "step": range(6),
        "kind": ["prefill", "decode", "decode", "decode", "prefill", "mixed"],
        "num_seqs": [1, 4, 40, 100, 2, 9],
        "cuda_graph": [0, 1, 1, 1, 1, 0],
        "measured_s": [0.030, 0.002, 0.003, 0.004, 0.010, 0.020],
        "predicted_profiled_s": [0.033, 0.002, 0.0027, 0.005, 0.009, 0.020],
        "decode_context_tokens": [0, 400, 4000, 10000, 0, 900],
        "decode_repeated_tokens": [0, 0, 2000, 7500, 0, 0],
    })


def test_decodes_are_grouped_by_batch_and_prefills_by_graph_or_eager():
    groups = step_groups(replay())
    assert groups.loc["decode (0, 8]", "steps"] == 1 and groups.loc["decode (32, 64]", "steps"] == 1
    assert groups.loc["prefill, eager", "steps"] == 2 and groups.loc["prefill, CUDA graph", "steps"] == 1
    np.testing.assert_allclose(groups.loc["decode (64, 128]", "err"], 0.25)
    np.testing.assert_allclose(groups.loc["decode (32, 64]", "repeated_share"], 0.5)
    np.testing.assert_allclose(groups.loc["prefill, eager", "err"], 0.053 / 0.050 - 1)
    total = groups.loc["all steps"]
    assert total["steps"] == 6
    np.testing.assert_allclose(total["measured_s"], replay()["measured_s"].sum())
    np.testing.assert_allclose(total["err"], replay()["predicted_profiled_s"].sum() / replay()["measured_s"].sum() - 1)


def test_a_replay_file_is_read_and_a_missing_one_or_cost_model_is_refused(tmp_path, capsys):
    path = tmp_path / "shared_prefix_offline_0.csv.gz"
    replay().to_csv(path, index=False)
    assert main([str(path)]) == 0
    assert "decode (64, 128]" in capsys.readouterr().out
    assert main([str(tmp_path / "absent.csv.gz")]) == 2
    assert main([str(path), "--cost-model", "roofline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "neither a replay file" in err[0] and "'roofline'" in err[1]


def test_a_comparison_replay_without_the_features_still_groups():
    groups = step_groups(replay().drop(columns=["decode_repeated_tokens", "decode_context_tokens"]))
    assert "repeated_share" not in groups.columns and groups.loc["all steps", "steps"] == 6


def test_detail_splits_prefills_by_tokens_and_every_step_by_what_ran_before_it():
    steps = replay().assign(num_prefill_tokens=[6000, 0, 0, 0, 1500, 3000], slept_s=[0.0, 0, 0, 0, 0.2, 0],
                            measured_host_s=[0.0, 0.0005, 0.0, 0.0, 0.001, 0.0])
    groups = step_groups(steps, detail=True)
    assert groups.loc["prefill, eager (4096.0, 8192.0], after idle", "steps"] == 1  # step 0: nothing before it
    assert groups.loc["decode (0, 8], after prefill", "steps"] == 1
    assert groups.loc["decode (32, 64], after decode", "steps"] == 1
    assert groups.loc["prefill, CUDA graph (1024.0, 2048.0], after idle", "steps"] == 1  # the loop slept before it
    assert groups.loc["prefill, eager (2048.0, 4096.0], after prefill", "steps"] == 1
    np.testing.assert_allclose(groups.loc["all steps", "host_s"], 0.0015)
    np.testing.assert_allclose(groups["share_of_time"].drop("all steps").sum(), 1.0)


def test_a_row_that_stands_for_several_steps_counts_them():
    steps = replay().assign(num_steps=[1, 5, 1, 1, 1, 1])
    groups = step_groups(steps)
    assert groups.loc["decode (0, 8]", "steps"] == 5 and groups.loc["all steps", "steps"] == 10
    assert step_groups(replay(), detail=True).loc["all steps", "steps"] == 6  # without the column: one each
