"""Workloads made on demand: the same requests as the list, in arrival order, served in bounded memory."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import SchedulerConfig, make_scheduler
from engine.core.block_manager import BlockManager
from engine.core.loop import SimulatedClock, run
from harness.convert import ConfigError
from harness.output.metrics import requests_frame, steps_frame, summarize
from harness.workloads import build_workload, source
from harness.workloads.config import LengthConfig, SharedPrefixConfig, WorkloadConfig
from tests.sim.test_fast_forward import _executor, _requests


def _key(requests) -> list[tuple]:
    return [(r.request_id, r.arrival_time, r.prompt_token_ids, r.sampling_params.max_tokens, r.sampling_params.seed)
            for r in requests]


def _reference_ids(cfg: WorkloadConfig, workload) -> list[list[int]]:
    """Every request's own token ids as the eager path drew them: one draw over all rows."""
    token_seq = np.random.SeedSequence(cfg.seed).spawn(5)[2]
    src = workload.source
    flat = np.random.default_rng(token_seq).integers(0, cfg.max_token_id, size=int(src.own.sum()), dtype=np.int64)
    ends = np.cumsum(src.own)
    return [flat[e - o : e].tolist() for e, o, k in zip(ends, src.own, src.keep) if k]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(1, 60), st.integers(1, 500), st.booleans(), st.booleans())
def test_lazy_ids_are_the_eager_draw_in_any_chunking(seed, n, chunk, prefix, skip):
    cfg = WorkloadConfig(num_requests=n, seed=seed, arrival="gamma", rate=10.0, cv=3.0,
                         prompt_len=LengthConfig("uniform", 1, 90), output_len=LengthConfig("uniform", 1, 40),
                         oversize="skip" if skip else "clip",
                         shared_prefix=SharedPrefixConfig(num_groups=2, prefix_len=7, fraction=0.5) if prefix else None)
    whole = build_workload(cfg, 100)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source, "CHUNK_TOKENS", chunk)
        chunked = build_workload(cfg, 100)
        requests, streamed = chunked.requests, list(chunked.stream())
    assert _key(requests) == _key(whole.requests)
    assert [r.prompt_token_ids[-len(ids):] if ids else [] for r, ids in
            zip(requests, _reference_ids(cfg, whole))] == _reference_ids(cfg, whole)
    assert _key(streamed) == _key(sorted(whole.requests, key=lambda r: r.arrival_time))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(1, 40), st.integers(1, 300), st.booleans(), st.integers(1, 20))
def test_streamed_prompt_block_keys_are_the_block_managers(seed, n, chunk, prefix, block_size):
    """stream(block_size) hands each request its full prompt blocks' keys, hashed from the drawn
    ids' bytes: the keys the block manager packs from the ids, shared prefixes included."""
    shared = SharedPrefixConfig(num_groups=2, prefix_len=23, fraction=0.5) if prefix else None
    cfg = WorkloadConfig(num_requests=n, seed=seed, arrival="gamma", rate=10.0, cv=3.0,
                         prompt_len=LengthConfig("uniform", 1, 90), output_len=LengthConfig("uniform", 1, 40),
                         shared_prefix=shared)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source, "CHUNK_TOKENS", chunk)
        streamed = list(build_workload(cfg, 100).stream(block_size))
    manager = BlockManager(4, block_size)
    for request in streamed:
        keys = request.block_hashes
        assert len(keys) == request.num_prompt_tokens // block_size
        request.block_hashes = []
        manager._extend_hashes(request, len(keys))
        assert request.block_hashes == keys


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.permutations(range(12)), st.integers(1, 3000))
def test_a_mooncake_trace_out_of_time_order_streams_without_drawing_ahead(tmp_path, times, chunk):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": {100 + 97 * t}, "output_length": 2, '
                            f'"hash_ids": [0, {t}, {t + 1}]}}\n' for t in times))
    cfg = WorkloadConfig(num_requests=None, arrival="trace", trace_path=str(path),
                         prompt_len=LengthConfig("trace"), output_len=LengthConfig("trace"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source, "CHUNK_TOKENS", chunk)
        workload = build_workload(cfg, 4096)
        stream, drawn = workload.stream(), []
        draw = workload.source.drawer
        patch.setattr(workload.source, "drawer", lambda: lambda a, b: (drawn.append((a, b)), draw()(a, b))[1])
        first = next(stream)
        own = workload.source.own
        # the earliest row's ids, wherever it is, and at most a chunk's worth of the rows after it
        assert first.arrival_time == 0 and sum(int(own[a:b].sum()) for a, b in drawn) <= chunk + own.max()
        streamed = [first, *stream]
    assert _key(streamed) == _key(sorted(workload.requests, key=lambda r: r.arrival_time))


def test_trace_rows_out_of_time_order_stream_in_arrival_order(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrived_at": [3.0, 1.0, 2.0, 0.5, 9.0], "num_prefill_tokens": [40, 50, 60, 70, 80],
                  "num_decode_tokens": [5, 6, 7, 8, 9]}).to_csv(path, index=False)
    cfg = WorkloadConfig(num_requests=None, arrival="trace", trace_path=str(path),
                         prompt_len=LengthConfig("trace"), output_len=LengthConfig("trace"))
    monkeypatch.setattr(source, "CHUNK_TOKENS", 1)
    workload = build_workload(cfg, 4096)
    assert [r.request_id for r in workload.stream()] == ["3", "1", "2", "0", "4"]
    assert _key(workload.stream()) == _key(sorted(workload.requests, key=lambda r: r.arrival_time))


def test_trace_repeat_shifts_each_repeat_by_the_span_and_a_mean_gap(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrived_at": [10.0, 11.0, 14.0], "num_prefill_tokens": [4, 5, 6],
                  "num_decode_tokens": [2, 3, 4]}).to_csv(path, index=False)
    base = dict(arrival="trace", trace_path=str(path), prompt_len=LengthConfig("trace"),
                output_len=LengthConfig("trace"), num_requests=7)
    repeated = build_workload(WorkloadConfig(**base, trace_repeat=True), 4096).requests
    assert [r.arrival_time for r in repeated] == [0.0, 1.0, 4.0, 6.0, 7.0, 10.0, 12.0]
    assert [len(r.prompt_token_ids) for r in repeated] == [4, 5, 6] * 2 + [4]
    assert len(build_workload(WorkloadConfig(**base), 4096).requests) == 3  # the rows there are
    with pytest.raises(ValueError, match="workload.trace_repeat"):
        WorkloadConfig(num_requests=3, trace_repeat=True)


def test_a_workload_too_large_for_memory_is_refused_in_one_line_before_allocating():
    with pytest.raises(ConfigError, match=r"workload.num_requests=1000000000000: .* GiB") as error:
        build_workload(WorkloadConfig(num_requests=10**12), 4096)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_compact_run_tables_equal_the_list_run(overlap, fast):
    def serve(compact: bool):
        executor = _executor(fast, overlap, 40)
        config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=60)
        scheduler = make_scheduler(config, executor.info())
        requests = sorted(_requests(7, 40, 60, False), key=lambda r: r.arrival_time)
        result = run(scheduler, executor, iter(requests) if compact else requests, SimulatedClock(),
                     compact=compact, keep_steps=not compact)
        return result, requests_frame(result), steps_frame(result)

    listed, compact = serve(False), serve(True)
    pd.testing.assert_frame_equal(listed[1], compact[1])
    assert compact[0].requests == [] and compact[0].steps == [] and len(compact[2]) == 0
    full = summarize(listed[1], listed[2], listed[0].makespan_s, 40)
    totalled = summarize(compact[1], compact[2], compact[0].makespan_s, 40, totals=compact[0].step_totals)
    assert full == totalled


def test_compact_run_refuses_requests_out_of_arrival_order():
    executor = _executor(False, False, 40)
    scheduler = make_scheduler(SchedulerConfig(max_model_len=60), executor.info())
    requests = sorted(_requests(3, 10, 60, False), key=lambda r: -r.arrival_time)
    with pytest.raises(ValueError, match="arrival order"):
        run(scheduler, executor, iter(requests), SimulatedClock(), compact=True)
