"""The cached context's K/V bytes of a prefill step (sim.prefill_programs, PREFILL_CACHED_KV_BYTES):
the column, its fit beside the program term, a saved fit, and the setting."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.scripting import compose_run_config
from sim.cost_model import make_cost_model
from sim.features import step_features
from sim.prefill_programs import PREFILL_CACHED_KV_BYTES, PREFILL_PROGRAM_KEYS, PrefillPrograms
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode, hardware, model, plan, prefill
from tests.sim.test_prefill_programs import GRAPHS, synthetic_grid

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")

# Qwen3-0.6B: 28 layers x 8 KV heads x 128 x (K, V) x 2 bytes = 114,688 bytes a cached token
KV = PrefillPrograms(8, 2, 28, 132, 2, kv_bytes_per_token=114_688, cached_kv=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 512), st.integers(0, 8192)), min_size=1, max_size=8),
       st.integers(1, 4096))
def test_the_bytes_grow_with_the_cached_context_and_vanish_without_it(chunks, more):
    step = plan(*(prefill(q, c, rid=f"p{i}") for i, (q, c) in enumerate(chunks)))
    row = step_features(step, GRAPHS)
    cached = sum(c for _, c in chunks)
    assert KV.cached_kv_bytes(row) == cached * KV.kv_bytes_per_token
    longer = plan(*(prefill(q, c + more * (i == 0), rid=f"p{i}") for i, (q, c) in enumerate(chunks)))
    assert KV.cached_kv_bytes(step_features(longer, GRAPHS)) > KV.cached_kv_bytes(row)
    fresh = plan(*(prefill(q, 0, rid=f"p{i}") for i, (q, _) in enumerate(chunks)))
    assert KV.cached_kv_bytes(step_features(fresh, GRAPHS)) == 0.0
    # a decode-only step's contexts are the decode kernel's reads
    assert KV.cached_kv_bytes(step_features(plan(decode(1000), decode(3000)), GRAPHS)) == 0.0


def kv_grid(per_byte_s: float) -> pd.DataFrame:
    """The synthetic grid timed with a planted price of the cached K/V bytes beside the program rate."""
    return synthetic_grid(2.4e-8, per_byte_s, KV)


def test_a_fit_recovers_the_planted_bandwidth_and_drops_the_term_where_the_rows_show_none(tmp_path):
    planted = 1 / 4.0e12  # 4 TB/s of cached K and V
    grid = kv_grid(planted)
    fitted = ProfiledCostModel.fit(grid, GRAPHS, prefill_programs=KV)
    coefs = dict(zip(fitted.fits["prefill_graph"].linear_features, fitted.fits["prefill_graph"].linear_coefs))
    assert coefs[PREFILL_CACHED_KV_BYTES] == pytest.approx(planted, rel=0.02)
    assert coefs[PREFILL_PROGRAM_KEYS] == pytest.approx(2.4e-8, rel=0.02)
    assert np.abs(fitted.predict(grid) / grid["duration_s"].to_numpy() - 1).max() < 0.01
    without = ProfiledCostModel.fit(grid, GRAPHS, prefill_programs=dataclasses.replace(KV, cached_kv=False))
    assert np.abs(without.predict(grid) / grid["duration_s"].to_numpy() - 1).max() > 0.05
    # rows that read their cached K/V cheaper than the other features say give the term no rate
    free = kv_grid(-planted / 20)
    kept = ProfiledCostModel.fit(free, GRAPHS, prefill_programs=KV)
    assert not kept.uses_cached_kv
    step = plan(prefill(16, 2048), prefill(16, 2048, rid="q"))
    plain = ProfiledCostModel.fit(free, GRAPHS, prefill_programs=dataclasses.replace(KV, cached_kv=False))
    assert kept.step_time(step) == plain.step_time(step)
    # a saved fit prices the bytes again, and refuses a kernel that does not know them
    path = tmp_path / "fit.csv"
    fitted.to_csv(path)
    again = ProfiledCostModel.load(path, GRAPHS, KV)
    assert again.step_time(step) == pytest.approx(fitted.step_time(step))
    assert again.predict(grid) == pytest.approx(fitted.predict(grid))
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        ProfiledCostModel.load(path, GRAPHS, PrefillPrograms(8, 2, 28, 132, 2))


def test_the_setting_fits_a_grid_with_the_bytes_and_needs_the_program_term(tmp_path):
    path = tmp_path / "grid.csv"
    kv_grid(1 / 4.0e12).to_csv(path, index=False)
    base = ["backend=sim", "backend.cost_model=profiled", f"backend.profile_path={path}", "hardware=h100",
            "model=qwen3-0.6b", "backend.prefill_programs=true"]
    rc = compose_run_config([*base, "backend.prefill_cached_kv=true"])
    cost = make_cost_model(rc.model, rc.hardware, rc.sim, GRAPHS)
    assert isinstance(cost, ProfiledCostModel) and cost.uses_cached_kv
    assert cost.prefill_programs == PrefillPrograms.of(model("qwen3-0.6b"), hardware("h100"), cached_kv=True)
    assert cost.prefill_programs is not None and cost.prefill_programs.kv_bytes_per_token == 114_688
    off = make_cost_model(rc.model, rc.hardware, compose_run_config(base).sim, GRAPHS)
    assert isinstance(off, ProfiledCostModel) and not off.uses_cached_kv
    with pytest.raises(ValueError, match="prefill_programs=true"):
        compose_run_config(["backend=sim", "backend.prefill_cached_kv=true"])
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        PrefillPrograms(8, 2, 28, 132, 2, cached_kv=True)
