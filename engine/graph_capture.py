"""Capture and replay of the model's forward as one CUDA graph per size, over static buffers.

GraphSet holds what decode graphs (engine.cuda_graph) and prefill graphs (engine.prefill_graphs)
share: the static buffers (engine.graph_buffers), a graph and an output tensor per size, and the
capture itself: largest size first, so that it sizes the memory pool, each after an eager run
(lazy initialisation such as kernel compilation, library handles or NCCL communicators must not
happen inside a capture). A subclass says what one size's layout, padding and metadata are.

With capture=False nothing is captured: a "replay" runs the model eagerly over the same static
buffers, which is how CPU tests check the padding and the layout.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.graph_buffers import GraphLayout, StaticBuffers


class GraphSet:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 sizes: tuple[int, ...], device: torch.device, capture: bool) -> None:
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = tuple(sorted(sizes))
        self.device = device
        self.captured = capture
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None  # the memory pool the graphs were captured into
        self.layouts = {size: self.layout(size) for size in self.sizes}
        self.buffers = StaticBuffers(list(self.layouts.values()), device)
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor, AttentionMetadata]] = {}

    def layout(self, size: int) -> GraphLayout:
        """The segment lengths of graph `size` (computed once per size, kept in self.layouts)."""
        raise NotImplementedError

    def metadata(self, size: int, segments: dict[str, torch.Tensor]) -> AttentionMetadata:
        """The attention metadata graph `size` reads, over its segments of the static buffers."""
        raise NotImplementedError

    def pad_extra(self, size: int, segments: dict[str, torch.Tensor]) -> None:
        """Padding of the segments StaticBuffers.pad leaves alone."""
        raise NotImplementedError

    def views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids [size], positions [size], metadata) of graph `size`, as views into the
        static buffers (the same tensors every time: the buffers never move)."""
        views = self._views.get(size)
        if views is None:
            segments = self.buffers.segments(self.layouts[size])
            views = segments["input_ids"], segments["positions"], self.metadata(size, segments)
            self._views[size] = views
        return views

    def logits_rows(self, size: int, num_sampled: int) -> torch.Tensor:  # [num_sampled] int64
        return self.buffers.logits_rows(self.layouts[size], num_sampled)

    def replay(self, size: int) -> torch.Tensor:  # [token rows of graph size, hidden]
        """Graph `size` over what was staged in the buffers (eagerly when not captured)."""
        if self.captured:
            self.graphs[size].replay()
            return self.outputs[size]
        ids, positions, meta = self.views(size)
        return self.model(ids, positions, self.kv_caches, meta)

    @torch.inference_mode()
    def capture(self, pool=None) -> None:
        """Capture every size into `pool` or a new one (kept in self.pool); nothing when
        capture=False."""
        if not self.captured:
            return
        for size in reversed(self.sizes):
            segments = self.buffers.segments(self.layouts[size])
            StaticBuffers.pad(segments)
            self.pad_extra(size, segments)
            ids, positions, meta = self.views(size)
            self.model(ids, positions, self.kv_caches, meta)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.model(ids, positions, self.kv_caches, meta)
            if pool is None:
                pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        self.pool = pool
