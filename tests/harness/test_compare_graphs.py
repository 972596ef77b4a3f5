"""The CUDA-graph sizes a comparison reads back from a saved engine run and hands the simulator."""

from __future__ import annotations

from engine.core.graph_sizes import prefill_graph_sizes
from harness.compare import engine_graph_sizes, sim_run_config
from harness.config import build_run_config
from sim.features import GraphSizes
from tests.harness.conftest import compose_config


def test_comparison_reads_the_engine_graph_sizes_back():
    meta = {"graph_batch_sizes": [1, 2, 4, 8], "prefill_graph_sizes": list(prefill_graph_sizes(1024)),
            "num_blocks": 100, "async_scheduling": True}
    assert engine_graph_sizes(meta) == GraphSizes((1, 2, 4, 8), prefill_graph_sizes(1024))
    rc = build_run_config(compose_config(["scheduler.max_num_seqs=8", "scheduler.max_num_batched_tokens=1024"]))
    sim = sim_run_config(rc, "roofline", None, meta).sim
    assert sim.graph_sizes(8, 1024) == engine_graph_sizes(meta)
    old = {k: v for k, v in meta.items() if k != "prefill_graph_sizes"}  # saved before prefill graphs
    assert engine_graph_sizes(old).prefill == () and sim_run_config(rc, "roofline", None, old).sim.prefill_graph_tokens == 0
