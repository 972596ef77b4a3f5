"""The CUDA-graph sizes a comparison reads back from a saved engine run and hands the simulator."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.config import ExecutionConfig
from engine.core.graph_sizes import GraphSizes, planned_graph_sizes, prefill_graph_sizes
from harness.compare.study import engine_execution, engine_graph_sizes, sim_run_config
from harness.config import build_run_config
from tests.harness.conftest import compose_config


def test_comparison_reads_the_engine_graph_sizes_back():
    meta = {"graph_batch_sizes": [1, 2, 4, 8], "prefill_graph_sizes": list(prefill_graph_sizes(1024)),
            "num_blocks": 100, "async_scheduling": True}
    assert engine_graph_sizes(meta) == GraphSizes((1, 2, 4, 8), prefill_graph_sizes(1024))
    rc = build_run_config(compose_config(["scheduler.max_num_seqs=8", "scheduler.max_num_batched_tokens=1024"]))
    sim = sim_run_config(rc, "roofline", None, meta).sim
    assert planned_graph_sizes(sim.execution, 8, 1024) == engine_graph_sizes(meta)
    assert sim.execution.async_scheduling is True
    old = {k: v for k, v in meta.items() if k != "prefill_graph_sizes"}  # saved before prefill graphs
    assert engine_graph_sizes(old).prefill == ()
    assert sim_run_config(rc, "roofline", None, old).sim.execution.prefill_graph_tokens == 0


@given(st.booleans(), st.integers(0, 9000), st.integers(1, 1024), st.integers(1, 1024), st.integers(1, 4),
       st.booleans(), st.integers(1, 40960))
def test_the_settings_read_back_from_captured_graphs_reproduce_them(eager, prefill_tokens, max_graph_batch,
                                                                    max_num_seqs, budget_factor, prefill_graphs,
                                                                    max_model_len):
    """The engine captures planned_graph_sizes; the simulator, given the settings engine_execution
    reads back from what was captured, plans exactly the same graphs (one rule, no translation),
    decode graphs captured for the same context."""
    budget = max_num_seqs * budget_factor
    engine = ExecutionConfig(enforce_eager=eager, prefill_graph_tokens=prefill_tokens,
                             max_graph_batch_size=max_graph_batch)
    captured = planned_graph_sizes(engine, max_num_seqs, budget, prefill_graphs, max_model_len)
    assert captured.decode_context == (max_model_len if captured.decode else 0)
    meta = {"graph_batch_sizes": list(captured.decode), "prefill_graph_sizes": list(captured.prefill),
            "decode_graph_context": captured.decode_context}
    assert engine_graph_sizes(meta) == captured
    assert planned_graph_sizes(engine_execution(meta), max_num_seqs, budget, max_model_len=max_model_len) == captured


def test_a_run_saved_before_the_capture_context_was_kept_reads_back_as_unknown():
    meta = {"graph_batch_sizes": [1, 2, 4], "prefill_graph_sizes": []}
    assert engine_graph_sizes(meta).decode_context == 0
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="decode_context"):
            GraphSizes((1, 2), (), bad)


def test_the_simulator_replays_the_all_reduce_the_engine_set_up_not_the_one_asked_for():
    asked = {"graph_batch_sizes": [1, 2], "engine_config": {"execution": {"tensor_parallel_size": 2,
                                                                        "all_reduce": "auto"}}}
    assert engine_execution(asked).all_reduce == "auto"
    assert engine_execution({**asked, "all_reduce": "nccl"}).all_reduce == "nccl"  # auto fell back
    assert engine_execution({**asked, "all_reduce": "symmetric"}).all_reduce == "symmetric"
    assert engine_execution({"graph_batch_sizes": [1]}).all_reduce == "nccl"  # saved before the setting


def test_the_engine_reports_the_context_its_decode_graphs_were_captured_for():
    from types import SimpleNamespace

    from engine.graph_use import captured_graph_sizes

    decode = SimpleNamespace(sizes=(1, 2, 4), captured=True, max_seq_len=16384)
    prefill = SimpleNamespace(sizes=(16, 32), captured=True)
    assert captured_graph_sizes(SimpleNamespace(graphs=decode, prefill_graphs=prefill)) == \
        GraphSizes((1, 2, 4), (16, 32), 16384)
    # graphs built without capture run eagerly: nothing replays, no context
    eager = SimpleNamespace(sizes=(1, 2, 4), captured=False, max_seq_len=16384)
    assert captured_graph_sizes(SimpleNamespace(graphs=eager, prefill_graphs=None)) == GraphSizes()
