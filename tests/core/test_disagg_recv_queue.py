"""run_disaggregated(recv_behind_step=True, landing_lag_s, send_lag_s): the receive's side of the
engine's transfer (engine.core.disagg_events, engine.core.transfer_receive), and the link's bytes
over its bandwidth."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.disagg_fleet import run_disaggregated
from engine.core.routers import RouterConfig, make_router
from engine.core.step_log import StepRecord
from engine.core.transfer_receive import RECV_START, SEND_START, WIRE_SECONDS, LagDraw, LandingWatch, WireGates
from sim.kv_transfer import KVTransferPricer, TransferConfig
from tests.core.fakes import OverlappingFakeExecutor
from tests.core.test_disagg import LinearPricer, _assert_blocks_returned, _pools
from tests.core.test_fleet import BLOCK, _requests
from tests.sim.helpers import hardware, model

WIRE_LATENCY, PER_TOKEN = 1e-3, 1e-5
# a long decode first, then a prompt whose first token comes while the decode replica is stepping
SPECS = [([7] * 30, 40, 0.0), ([5] * 60, 6, 0.0), ([3] * 20, 6, 0.0)]


def _run(specs, **options):
    prefill, decode = _pools(1, 1, executor_class=OverlappingFakeExecutor)
    make = (lambda: make_router(RouterConfig("least_requests"), BLOCK))  # noqa: E731
    result = run_disaggregated(prefill, decode, _requests(specs), make(), make(),
                               LinearPricer(WIRE_LATENCY, PER_TOKEN), **options)
    _assert_blocks_returned(prefill, decode)
    return result


def _wire(tokens: int) -> float:
    return WIRE_LATENCY + PER_TOKEN * tokens


def test_a_receive_queued_behind_a_decode_step_in_flight_takes_its_remaining_time():
    """Without the handshake the decode replica reserves and posts the receive as the first token
    comes: the wire starts at the end of the decode step in flight then (the send has none behind
    it), so the transfer takes that step's remaining time plus the wire."""
    plain, queued = _run(SPECS), _run(SPECS, recv_behind_step=True)
    steps = sorted(queued.decode[0].steps, key=lambda s: s.start_s)
    waited = 0
    for request in queued.requests:
        rid, tokens = request.request_id, request.num_prompt_tokens
        moved = queued.transfers[rid]
        assert math.isclose(plain.transfers[rid].transfer_s, _wire(tokens), abs_tol=1e-12)
        in_flight = [s.start_s + s.duration_s for s in steps if s.start_s <= moved.start_s < s.start_s + s.duration_s]
        wait = in_flight[0] - moved.start_s if in_flight else 0.0
        assert math.isclose(moved.transfer_s, wait + _wire(tokens), abs_tol=1e-12)
        waited += wait > 0
    assert waited >= 1  # the scenario has a receive behind a decode step


def test_receive_queue_off_changes_nothing():
    base = _run(SPECS, handshake=True, queue_behind_step=True)
    off = _run(SPECS, handshake=True, queue_behind_step=True, recv_behind_step=False, landing_lag_s=0.0,
               send_lag_s=0.0)
    assert {r: (t.start_s, t.transfer_s) for r, t in base.transfers.items()} == \
        {r: (t.start_s, t.transfer_s) for r, t in off.transfers.items()}
    assert [r.finish_time for r in base.requests] == [r.finish_time for r in off.requests]


def test_with_the_handshake_a_landing_is_seen_a_lag_after_a_decode_step_end_and_the_send_told_later():
    lag, send_lag = 4e-4, 7e-4
    plain = _run(SPECS, handshake=True, queue_behind_step=True, recv_behind_step=True)
    lagged = _run(SPECS, handshake=True, queue_behind_step=True, recv_behind_step=True, landing_lag_s=lag,
                  send_lag_s=send_lag)
    steps = [(s.start_s, s.start_s + s.duration_s) for s in lagged.decode[0].steps]
    for request in lagged.requests:
        moved = lagged.transfers[request.request_id]
        seen = moved.start_s + moved.transfer_s
        assert moved.transfer_s >= _wire(request.num_prompt_tokens) - 1e-12
        if not any(math.isclose(seen, e + lag, abs_tol=1e-9) for _, e in steps):
            # else only a decode replica with nothing under way sees it, at once
            assert not any(b + 1e-12 < seen < e - 1e-12 for b, e in steps)
    # the send is posted no earlier than send_lag after the reserve: every post moves later or stays
    later = [lagged.transfers[r].start_s - plain.transfers[r].start_s for r in plain.transfers]
    assert max(later) >= send_lag - 1e-12


def test_bytes_over_bandwidth_and_the_latency():
    qwen, h200 = model("qwen3-8b"), hardware("h200")
    pricer = KVTransferPricer(TransferConfig(bandwidth=200e9, latency_s=1e-5), qwen, h200, h200, 1, 1)
    seconds, nbytes = pricer.price(4096, 0, 0, 0.0)
    assert nbytes == 4096 * 2 * 36 * 8 * 128 * 2  # K and V, 36 layers, 8 KV heads of 128, bf16
    assert math.isclose(seconds, 1e-5 + nbytes / 200e9, rel_tol=1e-12)


def test_receive_options_are_checked():
    with pytest.raises(ValueError, match="fleet.transfer.recv_behind_step"):
        TransferConfig(recv_behind_step=1)  # type: ignore[arg-type]
    for name in ("landing_lag_s", "send_lag_s"):
        with pytest.raises(ValueError, match=f"fleet.transfer.{name}.*handshake"):
            TransferConfig(**{name: 1e-3})
        with pytest.raises(ValueError, match=f"fleet.transfer.{name}"):
            TransferConfig(handshake=True, **{name: -1.0})
    assert TransferConfig(recv_behind_step=True).receives_queue_behind_step()
    assert not TransferConfig(recv_behind_step=True, layerwise=True).receives_queue_behind_step()


@given(send=st.floats(0, 1), recv=st.floats(0, 1), seconds=st.floats(0, 1), order=st.permutations([0, 1, 2]))
def test_the_wire_starts_at_the_later_end_whatever_order_they_become_known(send, recv, seconds, order):
    gates, values = WireGates(), {SEND_START: send, RECV_START: recv, WIRE_SECONDS: seconds}
    answers = [gates.set("r", which, values[which]) for which in order]
    assert answers[:2] == [None, None] and answers[2] == (max(send, recv), seconds)
    assert not gates.gates


def test_a_landing_within_the_lag_after_a_step_end_is_seen_then_else_at_the_next_check():
    watch = LandingWatch(LagDraw(1e-3))
    watch.stepped(0, StepRecord(0.0, 5e-3, None))  # type: ignore[arg-type]
    assert math.isclose(watch.seen(0, 5.5e-3) or 0.0, 6e-3)  # the check 1 ms after the end at 5 ms
    assert watch.seen(0, 6.5e-3) is None  # past the check: the next step boundary's
    assert watch.seen(1, 5.5e-3) is None  # another replica's steps do not count
