"""Prefill CUDA graphs on the simulator's side: which steps the features mark as graph replays and
at what padded size, the "prefill_graph" regime of the profiled model, priced by device time
(tests/harness/test_compare_graphs.py: the sizes a comparison reads back from a saved engine run)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from engine.core.config import ExecutionConfig
from engine.core.graph_sizes import GraphSizes, decode_graph_sizes, planned_graph_sizes, prefill_graph_sizes
from sim.features import step_features
from sim.profiled import ProfiledCostModel, table_regimes
from sim.profiled_validation import priced_measurement, relative_errors
from tests.sim.helpers import decode, decode_batch, plan, prefill

GRAPHS = GraphSizes(decode_graph_sizes(256, 512), prefill_graph_sizes(4096))


@pytest.mark.parametrize("tokens, padded", [(1, 16), (16, 16), (17, 32), (300, 512), (513, 768), (4000, 4096)])
def test_a_prefill_within_the_largest_graph_replays_the_next_size(tokens, padded):
    f = step_features(plan(prefill(tokens, 100)), GRAPHS)
    assert (f["cuda_graph"], f["graph_batch_size"], f["num_tokens"]) == (1, padded, tokens)


def test_mixed_steps_pad_their_decode_rows_too_and_large_steps_stay_eager():
    mixed = plan(prefill(500, 0, rid="p"), *(decode(300 + i, rid=f"d{i}") for i in range(20)))
    f = step_features(mixed, GRAPHS)
    assert (f["cuda_graph"], f["graph_batch_size"]) == (1, 768)  # 520 tokens
    big = step_features(plan(prefill(4097, 0)), GRAPHS)
    assert (big["cuda_graph"], big["graph_batch_size"]) == (0, 1)
    # no prefill graphs (a plain sequence means decode sizes only): prefill eager, decode unchanged
    assert step_features(plan(prefill(100, 0)), decode_graph_sizes(256, 512))["cuda_graph"] == 0
    d = step_features(decode_batch([100] * 5), GRAPHS)
    assert (d["cuda_graph"], d["graph_batch_size"]) == (1, 8)


def test_planned_graph_sizes_follow_the_execution_settings():
    sizes = planned_graph_sizes(ExecutionConfig(), max_num_seqs=64, max_num_batched_tokens=2048)
    assert sizes.prefill == prefill_graph_sizes(2048) and sizes.decode == decode_graph_sizes(64, 64)
    assert planned_graph_sizes(ExecutionConfig(max_graph_batch_size=24), 512, 8192).decode == (1, 2, 4, 8, 16, 24)
    assert planned_graph_sizes(ExecutionConfig(prefill_graph_tokens=0), 64, 8192).prefill == ()
    assert planned_graph_sizes(ExecutionConfig(), 64, 8192, prefill_graphs=False).prefill == ()
    assert not planned_graph_sizes(ExecutionConfig(enforce_eager=True), 64, 8192)
    with pytest.raises(ValueError, match="prefill_graph_tokens"):
        ExecutionConfig(prefill_graph_tokens=-1)


def test_a_plan_marked_eager_has_eager_features():
    import dataclasses

    eager = dataclasses.replace(decode_batch([100] * 5), use_cuda_graphs=False)
    assert (step_features(eager, GRAPHS)["cuda_graph"], step_features(eager, GRAPHS)["graph_batch_size"]) == (0, 5)


def _time(f):
    # a graph replay costs its padded tokens and no launches; an eager prefill pays 20 ms of launches
    if f["cuda_graph"]:
        return 1e-3 + 2e-6 * f["graph_batch_size"]
    return max(0.02, 2e-6 * f["num_tokens"])


def test_the_profiled_model_prices_graph_prefills_by_their_padded_size():
    plans = [plan(prefill(t, 0)) for t in (16, 64, 200, 512, 700, 1024, 2000, 3000, 4096, 6000, 8192, 16384)]
    rows = [{**step_features(p, GRAPHS), "kind": "prefill"} for p in plans]
    rows += [{**step_features(decode_batch([500] * b), GRAPHS), "kind": "decode"} for b in (1, 8, 64, 256)]
    table = pd.DataFrame([{**r, "duration_s": _time(r)} for r in rows])
    assert set(table_regimes(table)) == {"prefill", "prefill_graph", "decode_graph"}
    model = ProfiledCostModel.fit(table, GRAPHS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tokens in (100, 513, 2500):  # padded to 128, 768, 2560
            f = step_features(plan(prefill(tokens, 0)), GRAPHS)
            # 5%: nine graph rows fit a knotted curve and four linear terms; unpadded is 20% off at 513
            assert model.step_time(plan(prefill(tokens, 0))) == pytest.approx(_time(f), rel=0.05)
        assert model.step_time(plan(prefill(7000, 0))) == pytest.approx(0.02, rel=0.02)  # eager: launch-bound
    # a profile of graph prefills only, read by a simulator without prefill graphs, still prices
    # its eager prefills, from the graph fit, and says so
    graphs_only = ProfiledCostModel.fit(table[table_regimes(table) != "prefill"], GRAPHS.decode)
    assert "prefill" not in graphs_only.fits
    with pytest.warns(UserWarning, match="pricing them as 'prefill_graph'"):
        eager_price = graphs_only.step_time(plan(prefill(3000, 0)))
    # by its 3,000 tokens (the graph law, unpadded), not by its one sequence
    assert eager_price == pytest.approx(1e-3 + 2e-6 * 3000, rel=0.05)


def test_graph_prefills_are_priced_by_device_time_and_graph_decodes_by_their_span():
    # back-to-back repeats of a graph prefill run 8% above its device time (the clock drops under
    # sustained compute); a graph decode's span carries 0.2 ms of host work beyond its device time
    plans = [plan(prefill(t, 0)) for t in (16, 64, 200, 512, 700, 1024, 2000, 3000, 4096, 6000, 8192, 16384)]
    plans += [decode_batch([500] * b) for b in (1, 8, 64, 256)]
    rows = []
    for p in plans:
        f = step_features(p, GRAPHS)
        size = f["graph_batch_size"] if f["cuda_graph"] else f["num_tokens"]
        gpu = 1e-3 + 2e-6 * size + 1e-5 * f["num_seqs"]
        span = gpu * 1.08 if f["num_prefill_tokens"] else gpu + 2e-4
        rows.append({**f, "duration_s": span if f["cuda_graph"] else max(gpu, 0.02), "gpu_s": gpu,
                     "launch_s": 0.02 if not f["cuda_graph"] else 1e-3})
    table = pd.DataFrame(rows)
    model = ProfiledCostModel.fit(table, GRAPHS)
    assert model.prices_overlap
    device = table_regimes(table).eq("prefill_graph").to_numpy()
    # what is priced: device time for graph prefills, the span for everything else
    np.testing.assert_allclose(priced_measurement(table), np.where(device, table["gpu_s"], table["duration_s"]))
    np.testing.assert_allclose(relative_errors(model, table), 0.0, atol=0.03)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        padded = step_features(plan(prefill(1000, 0)), GRAPHS)["graph_batch_size"]
        assert model.step_time(plan(prefill(1000, 0))) == pytest.approx(1e-3 + 2e-6 * padded + 1e-5, rel=0.02)
        decode = decode_batch([500] * 64)
        assert model.step_time(decode) == pytest.approx(1e-3 + 2e-6 * 64 + 64e-5 + 2e-4, rel=0.02)
