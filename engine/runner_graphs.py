"""A ModelRunner's CUDA graphs captured over its allocated KV cache: the decode graphs
(engine.cuda_graph) for batch sizes up to max_num_seqs, and the prefill graphs
(engine.prefill_graphs) for prefill and mixed steps up to a token count. Both kinds share one
memory pool when the prefill graphs are captured first; the runner replays them per step
(ModelRunner.forward). The capture itself is engine.graph_capture's (GraphSet)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.graph_sizes import decode_graph_sizes, prefill_graph_sizes
from engine.cuda_graph import DecodeGraphs
from engine.prefill_graphs import PrefillGraphs

if TYPE_CHECKING:
    from engine.runner import ModelRunner


def capture_decode_graphs(runner: ModelRunner, capture: bool = True) -> None:
    """Give the runner decode graphs for batch sizes up to max_num_seqs over its allocated cache.
    capture=False keeps the padded static-buffer path but runs it eagerly (tests on CPU)."""
    if runner.kv_cache is None:
        raise RuntimeError("capture_decode_graphs() needs the KV cache: call allocate_kv_cache() first")
    runner.graphs = None  # release the old graphs' memory pool before capturing the new ones
    # into the prefill graphs' pool where they were captured first: one pool for all
    pool = runner.prefill_graphs.pool if runner.prefill_graphs is not None else None
    scheduler, execution = runner.scheduler_config, runner.engine_config.execution
    graphs = DecodeGraphs(runner.model, runner.kv_caches,
                          decode_graph_sizes(scheduler.max_num_seqs, execution.max_graph_batch_size),
                          runner.max_blocks_per_seq, scheduler.max_model_len, runner.device, capture,
                          runner.balance_decode)
    graphs.capture(pool)
    runner.graphs = graphs


def capture_prefill_graphs(runner: ModelRunner, max_tokens: int, capture: bool = True) -> None:
    """Give the runner graphs for prefill and mixed steps of up to max_tokens tokens; call before
    capture_decode_graphs, which then shares their memory pool. Needs an attention backend that
    reads tile maps (Triton; the torch backend ignores them, which serves capture=False on CPU)."""
    if runner.kv_cache is None:
        raise RuntimeError("capture_prefill_graphs() needs the KV cache: call allocate_kv_cache() first")
    # the decode graphs go too: they live in the old prefill graphs' pool
    runner.graphs = runner.prefill_graphs = None
    scheduler = runner.scheduler_config
    sizes = prefill_graph_sizes(min(max_tokens, scheduler.max_num_batched_tokens))
    if not sizes:
        return
    attn = runner.model.model.layers[0].self_attn
    runner.prefill_graphs = PrefillGraphs(
        runner.model, runner.kv_caches, sizes, scheduler.max_num_seqs, runner.max_blocks_per_seq,
        scheduler.max_model_len, attn.num_heads // attn.num_kv_heads, runner.device, capture)
    runner.prefill_graphs.capture()
