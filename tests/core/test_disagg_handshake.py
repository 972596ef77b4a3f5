"""run_disaggregated(handshake=True): the engine's transfer protocol, where replicas act on
transfer messages only between their steps (engine.core.disagg_fleet)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import make_scheduler
from engine.core.disagg_fleet import run_disaggregated
from engine.core.loop import SimulatedClock, run
from engine.core.routers import RouterConfig, make_router
from sim.kv_transfer import TransferConfig
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor
from tests.core.test_disagg import LinearPricer, _assert_blocks_returned, _pools
from tests.core.test_fleet import BLOCK, CONFIG, _requests, arrivals


def _serve(prefill, decode, requests, pricer, handshake=True):
    make = (lambda: make_router(RouterConfig("least_requests"), BLOCK))  # noqa: E731
    return run_disaggregated(prefill, decode, requests, make(), make(), pricer, handshake=handshake)


def _step_ends(runs) -> list[float]:
    return [s.start_s + s.duration_s for r in runs for s in r.steps]


def _near(t: float, candidates: list[float]) -> bool:
    return any(math.isclose(t, c, rel_tol=0, abs_tol=1e-9) for c in candidates)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=arrivals(), p=st.integers(1, 2), d=st.integers(1, 2), decode_blocks=st.sampled_from([20, 40]),
       overlapped=st.booleans())
def test_sends_start_at_step_boundaries_and_tokens_are_unchanged(specs, p, d, decode_blocks, overlapped):
    executor_class = OverlappingFakeExecutor if overlapped else FakeExecutor
    prefill, decode = _pools(p, d, decode_blocks=decode_blocks, executor_class=executor_class)
    pricer = LinearPricer(1e-3, 1e-5)
    result = _serve(prefill, decode, _requests(specs), pricer)
    assert not result.rejected
    ends = _step_ends(result.prefill) + _step_ends(result.decode)
    for request in result.requests:
        moved = result.transfers[request.request_id]
        if moved.decode < 0:
            continue
        wire, _ = pricer.price(request.num_prompt_tokens, moved.prefill, moved.decode, 0.0)
        assert moved.start_s >= moved.ready_s
        # posted when the replicas' loops let it: at once, or where some step ended
        assert moved.start_s == moved.ready_s or _near(moved.start_s, ends)
        # seen landed no earlier than the wire allows, at once or where a decode step ended
        assert moved.transfer_s >= wire - 1e-12
        assert math.isclose(moved.transfer_s, wire, abs_tol=1e-12) or \
            _near(moved.start_s + moved.transfer_s, _step_ends(result.decode))
    single = FakeExecutor(200, BLOCK, vocab_size=50)
    alone = run(make_scheduler(CONFIG, single.info()), single, _requests(specs), SimulatedClock())
    assert [r.token_ids for r in alone.requests] == [r.token_ids for r in result.requests]
    _assert_blocks_returned(prefill, decode)


def test_an_idle_fleet_pays_no_handshake():
    """One request, nothing else running: the send starts at the first token, priced as without."""
    specs = [([7] * 30, 6, 0.0)]
    runs = []
    for handshake in (False, True):
        prefill, decode = _pools(1, 1)
        runs.append(_serve(prefill, decode, _requests(specs), LinearPricer(1e-3, 1e-5), handshake))
    (rid, plain), = runs[0].transfers.items()
    shaken = runs[1].transfers[rid]
    assert (shaken.start_s, shaken.transfer_s) == (plain.start_s, plain.transfer_s) == (plain.ready_s, 1e-3 + 30e-5)
    assert [r.finish_time for r in runs[0].requests] == [r.finish_time for r in runs[1].requests]


def test_a_send_waits_for_the_prefill_step_under_way():
    """A request's first token comes while the prefill replica has another prompt to compute: the
    send starts when that step ends (no overlap: no step in flight beyond it)."""
    specs = [([7] * 30, 6, 0.0), ([5] * 60, 6, 0.0)]
    prefill, decode = _pools(1, 1)
    result = _serve(prefill, decode, _requests(specs), LinearPricer(1e-3, 0.0))
    first = min(result.transfers.values(), key=lambda t: t.ready_s)
    ends = sorted(_step_ends(result.prefill))
    assert first.start_s > first.ready_s
    assert first.start_s == next(e for e in ends if e > first.ready_s)


def test_handshake_must_be_a_boolean():
    with pytest.raises(ValueError, match="fleet.transfer.handshake"):
        TransferConfig(handshake="yes")  # type: ignore[arg-type]


def _queued(queue: bool, specs, handshake: bool = False, executor_class=OverlappingFakeExecutor):
    prefill, decode = _pools(1, 1, executor_class=executor_class)
    make = (lambda: make_router(RouterConfig("least_requests"), BLOCK))  # noqa: E731
    result = run_disaggregated(prefill, decode, _requests(specs), make(), make(), LinearPricer(1e-3, 1e-5),
                               handshake=handshake, queue_behind_step=queue)
    _assert_blocks_returned(prefill, decode)
    return result


def test_a_prefill_step_in_flight_delays_the_send_by_its_remaining_time():
    """Two 64-token prompts (a full step each) on an overlapped prefill replica: the second's step
    is launched before the first's first token is read, so the first's send (queue_behind_step)
    waits on the prefill GPU for exactly the rest of that step, then takes its wire time."""
    specs = [([7] * 64, 6, 0.0), ([5] * 64, 6, 0.0)]
    plain, queued = _queued(False, specs), _queued(True, specs)
    first, second = sorted(queued.prefill[0].steps, key=lambda s: s.start_s)[:2]
    rid = min(queued.transfers, key=lambda r: queued.transfers[r].ready_s)
    moved, alone = queued.transfers[rid], plain.transfers[rid]
    wire = 1e-3 + 64e-5
    assert moved.start_s == moved.ready_s == first.start_s + first.duration_s == alone.start_s
    assert second.start_s == moved.start_s  # the step in flight when the first token came
    remaining = second.start_s + second.duration_s - moved.start_s
    assert remaining > 1e-3
    assert math.isclose(alone.transfer_s, wire, abs_tol=1e-12)
    assert math.isclose(moved.transfer_s, remaining + wire, abs_tol=1e-12)
    # the last prompt's send has no step behind which to queue
    last = max(queued.transfers, key=lambda r: queued.transfers[r].ready_s)
    assert queued.transfers[last].transfer_s == plain.transfers[last].transfer_s


@pytest.mark.parametrize("handshake", [False, True])
@pytest.mark.parametrize("executor_class", [FakeExecutor, OverlappingFakeExecutor])
def test_with_no_step_in_flight_a_queued_send_changes_nothing(handshake, executor_class):
    """One request: nothing runs on the prefill replica when its send is posted."""
    specs = [([7] * 30, 6, 0.0)]
    plain, queued = (_queued(q, specs, handshake, executor_class) for q in (False, True))
    (rid, alone), = plain.transfers.items()
    moved = queued.transfers[rid]
    assert (moved.start_s, moved.transfer_s, moved.bytes) == (alone.start_s, alone.transfer_s, alone.bytes)
    assert [r.token_ids for r in plain.requests] == [r.token_ids for r in queued.requests]
    assert [r.finish_time for r in plain.requests] == [r.finish_time for r in queued.requests]


def test_queue_behind_step_must_be_a_boolean_and_yields_to_layerwise():
    with pytest.raises(ValueError, match="fleet.transfer.queue_behind_step"):
        TransferConfig(queue_behind_step=1)  # type: ignore[arg-type]
    assert TransferConfig(queue_behind_step=True).sends_queue_behind_step()
    assert not TransferConfig(queue_behind_step=True, layerwise=True).sends_queue_behind_step()
