"""The static graph buffers' layout (engine.graph_buffers): declared once, it must place every
segment where the staging copy of a HostBatch puts it, aligned and without overlap."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.graph_buffers import INT32_SEGMENTS, INT64_SEGMENTS, GraphLayout, StaticBuffers
from engine.host_staging import HostStaging


@st.composite
def _layouts(draw):
    seqs = draw(st.integers(1, 40))
    tokens = draw(st.integers(seqs, 300))
    decode = draw(st.booleans())
    return GraphLayout(tokens=tokens, seqs=seqs, table_width=draw(st.integers(1, 20)),
                       decode_chunk=1 if decode else 0, tiles=0 if decode else draw(st.integers(1, 60)))


def _ranges(buffer: torch.Tensor, views: list[torch.Tensor]) -> list[tuple[int, int]]:
    base = buffer.data_ptr()
    return [((v.data_ptr() - base) // buffer.itemsize, (v.data_ptr() - base) // buffer.itemsize + v.numel())
            for v in views]


@given(st.lists(_layouts(), min_size=1, max_size=4), st.data())
def test_segments_are_aligned_disjoint_and_inside_the_buffers(layouts, data):
    buffers = StaticBuffers(layouts, torch.device("cpu"))
    for layout in layouts:
        num_sampled = data.draw(st.integers(0, layout.seqs))
        segments = buffers.segments(layout)
        assert set(segments) == set(INT64_SEGMENTS[:-1]) | set(INT32_SEGMENTS)
        assert segments["block_tables"].shape == (layout.seqs, layout.table_width)
        int64 = [segments[name] for name in INT64_SEGMENTS[:-1]] + [buffers.logits_rows(layout, num_sampled)]
        int32 = [segments[name] for name in INT32_SEGMENTS]
        for buffer, views, lengths in ((buffers.int64, int64, layout.int64_lengths(num_sampled)),
                                       (buffers.int32, int32, layout.int32_lengths())):
            assert [v.numel() for v in views] == list(lengths)
            views = [v for v in views if v.numel()]  # an empty view has no address to check
            ranges = _ranges(buffer, views)
            assert all(v.data_ptr() % 16 == 0 for v in views)
            assert ranges == sorted(ranges) and all(end <= buffer.numel() for _, end in ranges)
            assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))


@given(_layouts(), st.integers(0, 2**31))
def test_a_staged_batch_lands_in_the_layouts_segments(layout, seed):
    """What HostStaging copies into the buffers is what the graph's views read, segment by
    segment, for a batch that carries only the segments its step has."""
    rng = np.random.default_rng(seed)
    buffers = StaticBuffers([layout], torch.device("cpu"))
    num_sampled = int(rng.integers(0, layout.seqs + 1))
    int64 = [rng.integers(0, 1000, n) for n in layout.int64_lengths(num_sampled)]
    int32 = [rng.integers(0, 1000, n).astype(np.int32) for n in layout.int32_lengths()]
    present = [a for a in int32 if a.size]  # a decode step has no tile map, a prefill step no fair share
    staging = HostStaging(torch.device("cpu"))
    staging.upload(int64, torch.int64, out=buffers.int64)
    staging.upload(present, torch.int32, out=buffers.int32)
    segments = buffers.segments(layout)
    for name, array in zip(INT64_SEGMENTS, int64):
        view = buffers.logits_rows(layout, num_sampled) if name == "logits_indices" else segments[name]
        assert view.tolist() == array.tolist(), name
    for name, array in zip(INT32_SEGMENTS, int32):
        assert segments[name].flatten().tolist() == array.tolist(), name


def test_padding_leaves_nothing_for_the_cache():
    layout = GraphLayout(tokens=8, seqs=4, table_width=3, decode_chunk=1)
    buffers = StaticBuffers([layout], torch.device("cpu"))
    buffers.int64.fill_(7)
    buffers.int32.fill_(7)
    segments = buffers.segments(layout)
    StaticBuffers.pad(segments)
    assert segments["slot_mapping"].tolist() == [-1] * 8  # the store kernel skips these rows
    assert segments["input_ids"].tolist() == segments["positions"].tolist() == [0] * 8
    assert segments["seq_lens"].tolist() == [0] * 4 and not segments["block_tables"].any()
