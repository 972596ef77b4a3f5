"""The held-out table at the serving host (harness.fidelity.report.at_measured_host): where a call
measured the host that served a cell, that prediction is the cell's profiled row, the one at the
profile's host stays beside it, and the coverage, margins and targets read the measured one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.fidelity.report import (
    GRID_HOST,
    MEASURED_HOST,
    at_measured_host,
    cell_rows,
    coverage_table,
    merge,
    pool,
    target_table,
)

KEYS = ["model", "hardware", "workload", "load", "metric", "cost_model"]


def _row(workload: str, cost_model: str, sim: float, engine: float = 1.0, load: str = "0.5",
         metric: str = "ttft_p50_s", host: float | None = None) -> dict:
    row = {"model": "m", "hardware": "h", "workload": workload, "load": load, "metric": metric, "engine": engine,
           "sim": sim, "err": (sim - engine) / engine, "cost_model": cost_model, "engine_spread": 0.0,
           "sim_lo": 0.95 * sim, "sim_hi": 1.05 * sim, "in_interval": 0.95 * sim <= engine <= 1.05 * sim,
           "rate_req_s": 3.0, "engine_repeats": 2}
    if host is not None:
        row["host_scale"] = host
    return row


def test_a_measured_host_row_becomes_the_cells_profiled_row_and_the_profiles_host_stays_beside_it():
    table = pd.DataFrame([_row("a", "profiled", 0.7), _row("a", "roofline", 0.5), _row("a", "profiled_host", 0.98,
                                                                                        host=1.6),
                          _row("b", "profiled", 1.01), _row("b", "roofline", 0.9)])
    out = at_measured_host(table).set_index(["workload", "cost_model"])
    assert sorted(out.index) == [("a", "profiled"), ("a", GRID_HOST), ("a", "roofline"), ("b", "profiled"),
                                 ("b", "roofline")]
    assert out.loc[("a", "profiled"), "sim"] == 0.98 and out.loc[("a", GRID_HOST), "sim"] == 0.7
    assert out.loc[("a", "profiled"), "host_scale"] == 1.6 and out.loc[("a", "profiled"), "host_measured"]
    others = out.drop(index=("a", "profiled"))
    assert (others["host_scale"] == 1.0).all() and not others["host_measured"].any()


@st.composite
def _tables(draw) -> pd.DataFrame:
    rows = []
    for i in range(draw(st.integers(1, 6))):
        kinds = draw(st.sets(st.sampled_from(["profiled", "roofline", *MEASURED_HOST[:1]]), min_size=1))
        for kind in sorted(kinds):
            rows.append(_row(f"w{i}", kind, draw(st.floats(0.5, 2.0)),
                             host=draw(st.floats(0.5, 3.0)) if kind in MEASURED_HOST else None))
    return pd.DataFrame(rows)


@given(_tables())
@settings(max_examples=60, deadline=None)
def test_relabelling_keeps_every_prediction_and_is_idempotent(table):
    out = at_measured_host(table)
    assert len(out) == len(table) and not out.duplicated(KEYS).any()
    pd.testing.assert_frame_equal(at_measured_host(out), out)
    for workload, cell in table.groupby("workload"):
        mine = out[out["workload"] == workload].set_index("cost_model")
        kinds = set(cell["cost_model"])
        measured = bool(kinds & set(MEASURED_HOST))
        if measured:
            host = cell[cell["cost_model"].isin(MEASURED_HOST)].iloc[0]
            assert mine.loc["profiled", "sim"] == host["sim"] and mine.loc["profiled", "host_measured"]
            assert mine.loc["profiled", "host_scale"] == host["host_scale"]
        if "profiled" in kinds:
            kept = GRID_HOST if measured else "profiled"
            assert mine.loc[kept, "sim"] == cell.set_index("cost_model").loc["profiled", "sim"]
        assert not (set(mine.index) & set(MEASURED_HOST))


def test_a_later_call_at_the_profiles_host_replaces_the_measured_prediction_and_its_grid_row_goes():
    committed = at_measured_host(pd.DataFrame([_row("a", "profiled", 0.7), _row("a", "profiled_host", 0.98, host=1.6)]))
    later = pd.DataFrame([_row("a", "profiled", 0.9)])
    out = at_measured_host(merge([committed, later]))
    assert out["cost_model"].tolist() == ["profiled"] and out["sim"].tolist() == [0.9]
    assert not out["host_measured"].any()
    again = pd.DataFrame([_row("a", "profiled", 0.8), _row("a", "profiled_host", 1.1, host=1.3)])
    out = at_measured_host(merge([committed, again])).set_index("cost_model")
    assert out.loc["profiled", "sim"] == 1.1 and out.loc[GRID_HOST, "sim"] == 0.8 and len(out) == 2


def test_pooled_calls_average_their_hosts_and_are_measured_only_if_every_call_was():
    first = at_measured_host(pd.DataFrame([_row("a", "profiled", 0.7), _row("a", "profiled_host", 1.0, host=1.5)]))
    second = at_measured_host(pd.DataFrame([_row("a", "profiled", 0.9), _row("a", "profiled_host", 1.2, host=2.0)]))
    out = at_measured_host(pool([first, second])).set_index("cost_model")
    assert out.loc["profiled", "host_scale"] == pytest.approx(1.75) and out.loc["profiled", "host_measured"]
    assert out.loc["profiled", "sim"] == pytest.approx(1.1) and out.loc[GRID_HOST, "sim"] == pytest.approx(0.8)
    unmeasured = at_measured_host(pd.DataFrame([_row("a", "profiled", 0.9)]))
    mixed = at_measured_host(pool([first, unmeasured]))
    assert mixed["cost_model"].tolist() == ["profiled"] and not mixed["host_measured"].any()


def test_a_measured_row_without_its_host_is_refused():
    with pytest.raises(ValueError, match="host_scale"):
        at_measured_host(pd.DataFrame([_row("a", "profiled_run_host", 1.0)]))


def test_coverage_and_targets_read_the_cells_at_their_measured_host():
    """Ten classes whose profiled rows hold the engine; an eleventh missed by 40% at the profile's
    host and held at its measured host: counted inside once relabelled, and its target met."""
    rows = [_row(f"w{i}", "profiled", 1.0) for i in range(10)]
    rows += [_row("slow_host", "profiled", 0.6), _row("slow_host", "profiled_host", 0.99, host=1.7)]
    table = pd.DataFrame(rows)
    before = coverage_table(table[table["cost_model"] == "profiled"]).set_index("model").loc["m"]
    after = coverage_table(at_measured_host(table)).set_index("model").loc["m"]
    assert before["in_interval"] == pytest.approx(10 / 11) and after["in_interval"] == 1.0
    targets = target_table(at_measured_host(table)).set_index(["workload", "cost_model"])
    assert targets.loc[("slow_host", "profiled"), "within_10pct"] == 1
    assert targets.loc[("slow_host", GRID_HOST), "within_10pct"] == 0


def test_the_protocols_rows_carry_the_host_their_prediction_was_priced_at():
    rc = SimpleNamespace(model=SimpleNamespace(name="m"), hardware=SimpleNamespace(name="h"))
    sims = {"profiled": {"ttft_p50_s": 1.0},
            "profiled_host": {"ttft_p50_s": 1.2, "host_scale": 1.4, "host_jitter": 0.2}}
    rows = pd.DataFrame(cell_rows(rc, "w", "0.5", 3.0, [{"ttft_p50_s": 1.1}] * 2, sims, ["ttft_p50_s"]))
    assert np.isnan(rows.set_index("cost_model").loc["profiled", "host_scale"])
    out = at_measured_host(rows).set_index("cost_model")
    assert out.loc["profiled", "host_scale"] == 1.4 and out.loc[GRID_HOST, "host_scale"] == 1.0
    assert out.loc["profiled", "host_jitter"] == 0.2  # recorded, not priced (harness.fidelity.serving_host)
