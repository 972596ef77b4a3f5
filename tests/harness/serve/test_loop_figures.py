"""experiments/serve/loop_figures: the loop's own work per step read off a harness run's loop_s
(its low end: the steps that did not wait for the device) and loop_cost's slope, at the profile's host."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.serve.loop_figures import check, figures, loop_cost_table, sim_loop_overrides

BASE_US, SLOPE_US, SCALE = 110.0, 5.0, 1.6


def loop_cost(tmp_path) -> pd.DataFrame:
    path = tmp_path / "loop_cost.md"
    path.write_text("| sequences | harness us/step | server us/step | server_sender us/step |\n|---|---|---|---|\n"
                    f"| 4 | {30 + 4 * SLOPE_US} | {45 + 4 * SLOPE_US + 4} | 150.0 |\n"
                    f"| 48 | {30 + 48 * SLOPE_US} | {45 + 48 * SLOPE_US + 48} | 480.0 |\n")
    return loop_cost_table(path)


def harness_steps(seed: int = 0) -> pd.DataFrame:
    """Decode graph steps whose loop_s is the loop's own work, and on three steps of four also a
    wait for the device (which the low quartile must leave out)."""
    rng = np.random.default_rng(seed)
    seqs = rng.integers(1, 9, 4000)
    waits = np.where(rng.random(4000) < 0.75, rng.uniform(0.05e-3, 1e-3, 4000), 0.0)
    own = (BASE_US + SLOPE_US * seqs) * 1e-6
    return pd.DataFrame({"start": np.arange(4000) * 2e-3, "kind": "decode", "cuda_graph": 1, "num_seqs": seqs,
                         "launch_s": 1e-3, "slept_s": 0.0, "loop_s": own + waits})


def test_the_figures_are_the_loops_own_work_at_the_profiles_host(tmp_path):
    chosen = figures(harness_steps(), SCALE, loop_cost(tmp_path))
    assert chosen["loop_per_seq_s"] == pytest.approx(SLOPE_US * 1e-6 / SCALE)
    assert chosen["loop_s"] == pytest.approx(BASE_US * 1e-6 / SCALE, rel=0.03)  # the waits left out
    assert chosen["loop_extra_s"] == pytest.approx(15e-6 / SCALE) and \
        chosen["loop_extra_per_seq_s"] == pytest.approx(1e-6 / SCALE)


def test_the_check_prices_each_batch_size_at_the_given_host(tmp_path):
    steps = harness_steps()
    steps = steps.assign(num_seqs=np.array([2, 4, 8])[steps["num_seqs"] % 3])  # one size a bucket
    table = check(steps.assign(loop_s=(BASE_US + SLOPE_US * steps["num_seqs"]) * 1e-6 * SCALE), SCALE,
                  BASE_US * 1e-6, SLOPE_US * 1e-6).set_index("seqs")
    assert list(table.index) == ["1-2", "3-4", "5-8"]
    assert table["p25_pct"].abs().max() < 1e-6
    slower = check(steps, 2 * SCALE, BASE_US * 1e-6, SLOPE_US * 1e-6).set_index("seqs")
    assert list(slower["priced"]) == pytest.approx(list(2 * table["priced"]), rel=1e-3)


def test_bench_serve_sim_loop_flag():
    assert sim_loop_overrides("off") == []
    assert sim_loop_overrides("6.6e-05,2.9e-06,9.1e-06,6.6e-07") == [
        "backend.loop_s=6.6e-05", "backend.loop_per_seq_s=2.9e-06", "serve.loop_extra_s=9.1e-06",
        "serve.loop_extra_per_seq_s=6.6e-07"]
    for bad in ("on", "1e-4,2e-6", "1e-4,2e-6,1e-5,-1e-6"):
        with pytest.raises(ValueError, match="--sim-loop"):
            sim_loop_overrides(bad)


def test_loop_band_reads_cases_and_refuses_bad_hosts():
    import argparse

    from experiments.serve.loop_band import case_hosts

    assert case_hosts("azure_50=1.5,1.75") == ("azure_50", [1.5, 1.75])
    for bad in ("azure_50", "azure_50=", "azure_50=fast", "azure_50=1.5,-1", "=1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="CASE=HOST"):
            case_hosts(bad)
