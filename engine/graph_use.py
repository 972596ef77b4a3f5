"""What the executor needs to know of the runner's CUDA graphs: which sizes replay, and how to
run a step without them (a plan with use_cuda_graphs False)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from engine.core.graph_sizes import GraphSizes


def captured_graph_sizes(runner) -> GraphSizes:
    """The steps the runner replays as CUDA graphs (graphs built with capture=False run eagerly)."""
    def captured(graphs) -> tuple[int, ...]:
        return tuple(graphs.sizes) if graphs is not None and graphs.captured else ()

    decode = captured(runner.graphs)
    return GraphSizes(decode, captured(runner.prefill_graphs), runner.graphs.max_seq_len if decode else 0)


@contextlib.contextmanager
def graphs_detached(runner, detach: bool) -> Iterator[None]:
    """With detach, the runner holds no graphs for the duration, so every step runs eagerly."""
    if not detach:
        yield
        return
    held = runner.graphs, runner.prefill_graphs
    runner.graphs = runner.prefill_graphs = None
    try:
        yield
    finally:
        runner.graphs, runner.prefill_graphs = held
