"""harness.fidelity.windows and experiments/fidelity/windows.py: a request's window between its first
and last token split into the steps that ran in it, counted right on a hand-made schedule, and the
engine-against-simulator comparison of a cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.fidelity.windows import cell_comparison, main
from harness.fidelity.windows import window_parts, window_row, window_table


def schedule(num_steps: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two requests: a's prefill ends at 1, then decode (0.1 s), b's prefill (0.5 s), two decodes; b
    joins them. a has 3 output tokens (finishes at 1.7), b 3 (first token at 1.6, finishes 1.8)."""
    steps = pd.DataFrame({"start": [0.0, 1.0, 1.1, 1.6, 1.7], "duration": [1.0, 0.1, 0.5, 0.1, 0.1],
                          "kind": ["prefill", "decode", "prefill", "decode", "decode"],
                          "prefill_tokens": [100, 0, 50, 0, 0]})
    requests = pd.DataFrame({"first_token": [1.0, 1.6], "finish": [1.7, 1.8], "output_tokens": [3, 3]})
    requests["tpot"] = (requests["finish"] - requests["first_token"]) / (requests["output_tokens"] - 1)
    if num_steps:  # b's two decodes as one fast-forwarded row of two steps (a's finish would end it: not here)
        steps = pd.concat([steps.iloc[:3], pd.DataFrame({"start": [1.6], "duration": [0.2], "kind": ["decode"],
                                                          "prefill_tokens": [0], "num_steps": [2]})])
    return requests, steps


def test_a_window_holds_the_steps_between_a_requests_first_and_last_token():
    requests, steps = schedule()
    parts = window_parts(requests, steps)
    np.testing.assert_allclose(parts["prefill_s"], [0.5, 0.0])
    np.testing.assert_allclose(parts["decode_s"], [0.2, 0.2])
    np.testing.assert_allclose(parts["prefill_steps"], [1, 0])
    np.testing.assert_allclose(parts["decode_steps"], parts["tokens"])  # one decode step per later token
    np.testing.assert_allclose(parts["other_s"], 0.0, atol=1e-12)
    row = window_row("sim", requests, steps)
    assert row["prefill_steps"] == 2 and row["decode_steps"] == 3
    assert row["prefill_step_mean_s"] == pytest.approx(0.75) and row["prefill_tokens_per_step"] == pytest.approx(75)


def test_a_row_of_several_steps_counts_them_once_each():
    requests, steps = schedule(num_steps=True)
    row = window_row("sim", requests, steps)
    assert row["decode_steps"] == 3 and row["decode_step_mean_s"] == pytest.approx(0.1)
    assert window_parts(requests, steps)["decode_steps"].iloc[1] == 2  # b's window: the whole run


def test_the_comparison_is_the_engines_mean_and_each_simulations_error(tmp_path, capsys):
    requests, steps = schedule()
    slower = steps.assign(duration=steps["duration"] * 1.1, start=steps["start"] * 1.1)
    runs = {"engine 0": (requests.assign(finish=requests["finish"] * 1.1, first_token=requests["first_token"] * 1.1,
                                         tpot=requests["tpot"] * 1.1), slower),
            "engine 1": (requests.assign(finish=requests["finish"] * 1.1, first_token=requests["first_token"] * 1.1,
                                         tpot=requests["tpot"] * 1.1), slower),
            "sim profiled": schedule()}
    table = window_table(runs)
    compared = cell_comparison(table)
    assert compared.loc["sim profiled err", "prefill_step_mean_s"] == pytest.approx(1 / 1.1 - 1)
    assert compared.loc["sim profiled err", "prefill_steps"] == pytest.approx(0.0)
    table.to_csv(tmp_path / "code_completion_0.8_windows.csv", index=False)
    assert main([str(tmp_path)]) == 0 and "code_completion_0.8" in capsys.readouterr().out
    assert main([str(tmp_path / "none")]) == 2
