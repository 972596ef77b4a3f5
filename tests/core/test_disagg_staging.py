"""A simulated decode replica takes a transfer only with room in its prefill peer's receive staging
ring (engine.core.kv_staging.StagingRing, the engine's rule): transfers wait, none deadlocks, every
request finishes, and a ring frees its ranges oldest first once each transfer before them landed."""

from __future__ import annotations

import pytest

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_fleet import run_disaggregated
from engine.core.kv_staging import STAGED_REQUESTS_PER_PEER, staging_blocks_per_peer
from engine.core.loop import SimulatedClock
from engine.core.routers import ROUTER_REGISTRY
from tests.core.fakes import FakeExecutor
from tests.core.test_disagg import LinearPricer

BLOCK = 8
# max_model_len 32: a ring of 2 requests of 4 blocks per prefill peer
CONFIG = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=32)
RING = staging_blocks_per_peer(-(-CONFIG.max_model_len // BLOCK))


def _serve(p: int, d: int, requests: list[Request], pricer: LinearPricer, handshake: bool):
    def pool(kind, count):
        return [kind(i, make_scheduler(CONFIG, (ex := FakeExecutor(400, BLOCK, vocab_size=50)).info()), ex,
                     SimulatedClock()) for i in range(count)]

    prefill, decode = pool(PrefillReplica, p), pool(DecodeReplica, d)
    routers = [ROUTER_REGISTRY.get("round_robin")() for _ in range(2)]
    return run_disaggregated(prefill, decode, requests, *routers, pricer, handshake=handshake)


def _request(i: int, prompt_len: int, arrival: float = 0.0) -> Request:
    return Request(f"r{i}", [1 + i % 40] * prompt_len, SamplingParams(max_tokens=4, ignore_eos=True), arrival)


def _most_in_flight(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # an end before a start at a tie
    most = live = 0
    for _, step in edges:
        live += step
        most = max(most, live)
    return most


@pytest.mark.parametrize("handshake", [False, True])
@pytest.mark.parametrize("p", [1, 2])
def test_a_full_ring_holds_transfers_back_per_prefill_peer(p, handshake):
    """Full-length prompts and 1 s transfers against a decode cache with room for all: only the
    ring bounds what is in flight, STAGED_REQUESTS_PER_PEER from each prefill replica at once."""
    requests = [_request(i, 25) for i in range(12)]
    result = _serve(p, 1, requests, LinearPricer(1.0), handshake)
    assert len(result.requests) == 12 and all(r.num_output_tokens == 4 for r in result.requests)
    assert RING == STAGED_REQUESTS_PER_PEER * 4
    for peer in range(p):
        # the landing is the priced second after the send (handshake: transfer_s runs on to a step boundary)
        flights = [(t.start_s, t.start_s + 1.0) for t in result.transfers.values() if t.prefill == peer]
        assert len(flights) == 12 // p and _most_in_flight(flights) == STAGED_REQUESTS_PER_PEER
    everyone = [(t.start_s, t.start_s + 1.0) for t in result.transfers.values()]
    assert _most_in_flight(everyone) == p * STAGED_REQUESTS_PER_PEER  # a ring per peer, not one shared
    assert max(t.start_s - t.ready_s for t in result.transfers.values()) > 1.0  # waited for a landing
    assert result.max_blocked > 0
    assert result.makespan_s >= 12 / (p * STAGED_REQUESTS_PER_PEER)


def test_a_ring_frees_a_range_only_once_every_earlier_transfer_from_its_peer_landed():
    """a (4 blocks) and b (1 block) fill the ring but for 3 blocks at its end, so c (4 blocks) waits;
    b lands first, yet c starts only after a landed: the engine scatters receives in posting order."""
    requests = [_request(0, 25), _request(1, 1), _request(2, 25)]
    result = _serve(1, 1, requests, LinearPricer(0.0, 0.01), handshake=False)
    a, b, c = (result.transfers[f"r{i}"] for i in range(3))
    assert a.start_s == b.start_s and b.start_s + b.transfer_s < a.start_s + a.transfer_s
    assert c.start_s >= a.start_s + a.transfer_s
    assert len(result.requests) == 3
