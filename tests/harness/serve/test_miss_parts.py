"""experiments/serve/miss_parts.py: the five parts of the simulator server's miss add up to it
exactly, whatever the runs, and each lands where its difference is."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.serve.miss_parts import PARTS, miss_parts


def run(rng: np.random.Generator, n: int, scale: float) -> pd.DataFrame:
    """A core's requests (ttft, tpot in s) with a client's figures (ttft_s, itl_s) beside them."""
    ttft = rng.lognormal(np.log(0.01 * scale), 0.5, n)
    tpot = rng.lognormal(np.log(0.004 * scale), 0.2, n)
    return pd.DataFrame({"ttft": ttft, "tpot": tpot, "ttft_s": ttft + rng.uniform(5e-4, 3e-3, n),
                         "itl_s": tpot + rng.normal(0, 1e-5, n)})


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(5, 300), scales=st.lists(st.floats(0.5, 2.0), min_size=5,
                                                                           max_size=5))
def test_the_parts_add_up_to_the_miss(seed, n, scales):
    rng = np.random.default_rng(seed)
    engine, sim, harness, at_harness, at_sim = (run(rng, n, s) for s in scales)
    table = miss_parts(engine, sim, harness, at_harness, at_sim)
    assert list(table["figure"]) == ["ttft_p50", "ttft_p90", "itl_p50", "itl_p90"]
    summed = table[[f"{p}_pct" for p in PARTS]].sum(axis=1)
    assert summed.to_numpy() == pytest.approx(table["miss_pct"].to_numpy(), rel=1e-9, abs=1e-9)
    assert table["miss_ms"].to_numpy() == pytest.approx((table["sim_ms"] - table["engine_ms"]).to_numpy())


def test_each_difference_lands_in_its_part():
    rng = np.random.default_rng(0)
    engine = run(rng, 200, 1.0)
    same = engine[["ttft", "tpot"]]
    # the server costs the engine's steps 10%: the harness's loop ran them faster, the model agrees
    harness = same.assign(tpot=same["tpot"] / 1.1)
    table = miss_parts(engine, engine, harness, harness, same).set_index("figure")
    assert table.loc["itl_p50", "server_steps_pct"] == pytest.approx(-100 * 0.1 / 1.1, rel=0.05)
    assert table.loc["itl_p50", "arrivals_pct"] == pytest.approx(-table.loc["itl_p50", "server_steps_pct"], rel=1e-9)
    assert table.loc["itl_p50", "miss_pct"] == pytest.approx(0, abs=1e-9)
    # the simulator server's core lags its schedule by 1 ms at first token
    late = engine.assign(ttft=engine["ttft"] + 1e-3, ttft_s=engine["ttft_s"] + 1e-3)
    table = miss_parts(engine, late, same, same, same).set_index("figure")
    assert table.loc["ttft_p50", "sim_off_schedule_pct"] == pytest.approx(table.loc["ttft_p50", "miss_pct"])
    assert table.loc["ttft_p50", "miss_ms"] == pytest.approx(1.0)
    assert table.loc["ttft_p50", "outside_core_pct"] == pytest.approx(0, abs=1e-9)
