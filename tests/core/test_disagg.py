"""Disaggregated fleets (engine.core.disagg, engine.core.disagg_fleet) on fake executors."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import make_scheduler
from engine.core.disagg import DecodeReplica, PrefillReplica, prefill_copy
from engine.core.disagg_fleet import run_disaggregated
from engine.core.loop import SimulatedClock, run
from engine.core.routers import RouterConfig, make_router
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor
from tests.core.test_fleet import BLOCK, CONFIG, _requests, arrivals


class LinearPricer:
    """latency + seconds_per_token x tokens; 4 bytes a token."""

    def __init__(self, latency_s: float = 0.0, seconds_per_token: float = 0.0) -> None:
        self.latency_s, self.seconds_per_token = latency_s, seconds_per_token
        self.calls: list[str] = []

    def price(self, num_tokens: int, prefill: int, decode: int, overlap_s: float) -> tuple[float, int]:
        return self.latency_s + self.seconds_per_token * num_tokens, 4 * num_tokens


def _pools(p, d, prefill_blocks=40, decode_blocks=40, executor_class=FakeExecutor):
    prefill, decode = [], []
    for i in range(p):
        ex = executor_class(prefill_blocks, BLOCK, vocab_size=50)
        prefill.append(PrefillReplica(i, make_scheduler(CONFIG, ex.info()), ex, SimulatedClock()))
    for i in range(d):
        ex = executor_class(decode_blocks, BLOCK, vocab_size=50)
        decode.append(DecodeReplica(i, make_scheduler(CONFIG, ex.info()), ex, SimulatedClock()))
    return prefill, decode


def _serve(prefill, decode, requests, pricer=None, router="least_requests"):
    make = (lambda: make_router(RouterConfig(router), BLOCK))  # noqa: E731
    return run_disaggregated(prefill, decode, requests, make(), make(), pricer or LinearPricer(1e-3, 1e-5))


def _assert_blocks_returned(prefill, decode):
    for replica in [*prefill, *decode]:
        bm = replica.scheduler.block_manager
        assert bm.num_free_blocks == bm.num_blocks
        assert all(count == 0 for count in bm.ref_counts) and bm.num_holders == 0
    for replica in prefill:
        assert not replica.holding.held


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=arrivals(), p=st.integers(1, 2), d=st.integers(1, 3), decode_blocks=st.sampled_from([20, 40]),
       overlapped=st.booleans())
def test_every_request_finishes_with_its_tokens_and_moves_once(specs, p, d, decode_blocks, overlapped):
    requests = _requests(specs)
    executor_class = OverlappingFakeExecutor if overlapped else FakeExecutor
    prefill, decode = _pools(p, d, decode_blocks=decode_blocks, executor_class=executor_class)
    result = _serve(prefill, decode, requests)
    assert not result.rejected
    in_order = sorted(requests, key=lambda r: r.arrival_time)
    assert [r.request_id for r in result.requests] == [r.request_id for r in in_order]
    decoded = [r.request_id for run_ in result.decode for r in run_.requests]
    assert len(decoded) == len(set(decoded))  # decoded once
    for request in result.requests:
        assert request.num_output_tokens == request.sampling_params.max_tokens
        moved = result.transfers[request.request_id]
        if request.sampling_params.max_tokens > 1:
            assert moved.decode >= 0 and math.isfinite(moved.start_s) and moved.bytes == 4 * request.num_prompt_tokens
            assert request.request_id in decoded
            assert moved.start_s >= moved.ready_s == request.first_token_time
        else:  # its first token is its last: nothing to move
            assert moved.decode == -1 and request.request_id not in decoded
    # the same tokens as one aggregated replica (the fake samples from id and position)
    single = FakeExecutor(200, BLOCK, vocab_size=50)
    alone = run(make_scheduler(CONFIG, single.info()), single, _requests(specs), SimulatedClock())
    assert [r.token_ids for r in alone.requests] == [r.token_ids for r in result.requests]
    _assert_blocks_returned(prefill, decode)


def test_free_transfer_gives_the_prefill_replicas_ttft_and_a_decode_only_tpot():
    """Bandwidth -> infinity, latency 0, P = D = 1 on the same executor: the first tokens come when
    the prefill replica alone samples them, and the decode replica behaves as one fed prefilled
    requests at those instants."""
    specs = [([7] * 30 + [i], 6 + i % 5, 0.002 * i) for i in range(12)]
    prefill, decode = _pools(1, 1)
    result = _serve(prefill, decode, _requests(specs), LinearPricer(0.0, 0.0))
    ex = FakeExecutor(40, BLOCK, vocab_size=50)
    copies = [prefill_copy(r) for r in _requests(specs)]
    only_prefill = run(make_scheduler(CONFIG, ex.info()), ex, copies, SimulatedClock())
    assert [r.first_token_time for r in result.requests] == [r.first_token_time for r in only_prefill.requests]
    # a decode replica alone, each request handed over at its first token with that token
    _, (solo,) = _pools(1, 1)
    handed = []
    for original, copy in zip(_requests(specs), only_prefill.requests):
        original.token_ids = list(copy.token_ids)
        original.first_token_time = copy.first_token_time
        original.max_tokens = original.sampling_params.max_tokens
        handed.append(original)
    for original in sorted(handed, key=lambda r: r.first_token_time):
        while solo.next_event_time() < original.first_token_time:
            solo.tick()
        solo.reserve(original)
        solo.arrived(original, original.first_token_time)
    while solo.next_event_time() < math.inf:
        solo.tick()
    assert [r.finish_time for r in result.requests] == pytest.approx([r.finish_time for r in handed], abs=1e-12)


def test_back_pressure_holds_prefill_blocks_when_the_decode_cache_is_full():
    # a decode cache of 6 blocks takes one request of 33 prompt + 16 output tokens at a time
    specs = [([10 + i] * 33, 16, 0.0) for i in range(6)]
    prefill, decode = _pools(1, 1, prefill_blocks=40, decode_blocks=7)
    held_seen = []
    original_release = prefill[0].holding.release

    def release(request_id):
        held_seen.append(prefill[0].holding.num_held_blocks)
        original_release(request_id)

    prefill[0].holding.release = release
    result = _serve(prefill, decode, _requests(specs))
    assert result.max_blocked >= 2
    assert max(held_seen) >= 3 * 5  # several requests' 5 blocks each held at once on the prefill side
    waits = [t.start_s - t.ready_s for t in result.transfers.values()]
    assert max(waits) > 0
    assert all(r.num_output_tokens == 16 for r in result.requests)
    _assert_blocks_returned(prefill, decode)


def test_held_blocks_stall_prefill_admission_until_released():
    # the prefill cache (10 blocks) holds two prompts of 5 blocks; the third waits for a transfer to end
    specs = [([10 + i] * 33, 4, 0.0) for i in range(3)]  # no shared prefix
    prefill, decode = _pools(1, 1, prefill_blocks=10, decode_blocks=40)
    result = _serve(prefill, decode, _requests(specs), LinearPricer(0.5, 0.0))
    third = result.requests[2]
    first_landed = min(t.start_s + t.transfer_s for t in result.transfers.values())
    assert third.first_scheduled_time >= first_landed
    _assert_blocks_returned(prefill, decode)


def test_a_request_too_large_for_the_decode_cache_is_rejected_and_its_blocks_returned():
    specs = [([1] * 40, 40, 0.0), ([2] * 8, 4, 0.0)]
    prefill, decode = _pools(1, 1, decode_blocks=6)
    result = _serve(prefill, decode, _requests(specs))
    assert list(result.rejected) == ["q0"]
    assert [r.request_id for r in result.requests] == ["q1"]
    _assert_blocks_returned(prefill, decode)
