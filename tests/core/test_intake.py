"""A fleet's request intake (engine.core.intake): a replica sees a request its intake after the
arrival (never before one routed to it earlier), requests routed to it at one arrival are seen
together with their tokens summed, TTFT still counts from the arrival, and no intake (or a zero
one) leaves a fleet's run as it was."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_fleet import run_disaggregated
from engine.core.fleet import run_fleet
from engine.core.intake import Intake
from engine.core.loop import Replica, SimulatedClock
from engine.core.routers import RouterConfig, make_router
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor

BLOCK = 8
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128)


def _requests(specs):
    return [Request(f"q{i}", [5 + i % 7] * p, SamplingParams(max_tokens=m, ignore_eos=True), arrival_time=t)
            for i, (p, m, t) in enumerate(specs)]


def _fleet(n, intake, executor_class=FakeExecutor):
    replicas = []
    for i in range(n):
        executor = executor_class(60, BLOCK, vocab_size=50)
        replica = Replica(i, make_scheduler(CONFIG, executor.info()), executor, SimulatedClock())
        replica.intake = intake
        replicas.append(replica)
    return replicas


def _serve(specs, n, intake, executor_class=FakeExecutor):
    requests = _requests(specs)
    result = run_fleet(_fleet(n, intake, executor_class), requests, make_router(RouterConfig("round_robin"), BLOCK))
    return requests, result


SPECS = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 6), st.sampled_from([0.0, 0.001, 0.002, 0.0035, 0.01])),
                 min_size=1, max_size=16)


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf"), True, "1"])
def test_intake_refuses_what_is_not_seconds(bad):
    with pytest.raises(ValueError, match="Intake.base_s"):
        Intake(bad)
    with pytest.raises(ValueError, match="Intake.per_token_s"):
        Intake(0.0, bad)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS, st.integers(1, 3), st.sampled_from([FakeExecutor, OverlappingFakeExecutor]))
def test_a_zero_intake_changes_nothing(specs, n, executor_class):
    rows = []
    for intake in (None, Intake(0.0, 0.0)):
        requests, _ = _serve(specs, n, intake, executor_class)
        rows.append([(r.request_id, tuple(r.token_ids), r.first_scheduled_time, r.first_token_time, r.finish_time)
                     for r in requests])
    assert rows[0] == rows[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECS, st.integers(1, 3), st.floats(0.0, 5e-3), st.floats(0.0, 1e-4),
       st.sampled_from([FakeExecutor, OverlappingFakeExecutor]))
def test_a_request_is_seen_its_message_s_intake_after_arriving_and_in_routing_order(specs, n, base, per_token,
                                                                                    executor_class):
    intake = Intake(base, per_token)
    requests, result = _serve(specs, n, intake, executor_class)
    for replica in result.replicas:
        mine = sorted(replica.requests, key=lambda r: (r.arrival_time, int(r.request_id[1:])))
        message = {}
        for r in mine:  # one message per arrival time: its tokens summed
            message[r.arrival_time] = message.get(r.arrival_time, 0) + r.num_prompt_tokens
        seen = [r.arrival_time + intake.delay_s(message[r.arrival_time]) for r in mine]
        for r, t in zip(mine, seen):
            assert r.first_scheduled_time >= t - 1e-12
        # never scheduled before a request routed to the same replica earlier was seen (one pipe)
        for t, later in zip(seen, mine[1:]):
            assert later.first_scheduled_time >= t - 1e-12
    assert all(r.num_output_tokens == r.max_tokens for r in requests)


def test_an_idle_replica_starts_a_request_its_intake_after_the_arrival_and_ttft_counts_from_the_arrival():
    intake = Intake(1e-3, 1e-5)
    (alone,), _ = _serve([(16, 2, 0.5)], 1, intake)
    (without,), _ = _serve([(16, 2, 0.5)], 1, None)
    delay = 1e-3 + 16 * 1e-5
    assert alone.first_scheduled_time == pytest.approx(0.5 + delay)
    assert alone.first_token_time - alone.arrival_time == pytest.approx(without.first_token_time - 0.5 + delay)


def test_requests_arriving_together_are_seen_together():
    intake = Intake(1e-3, 1e-4)
    requests, _ = _serve([(10, 2, 0.0), (30, 2, 0.0), (20, 2, 0.0)], 1, intake)
    together = 1e-3 + 60 * 1e-4  # one message of all three prompts
    assert [r.first_scheduled_time for r in requests] == pytest.approx([together] * 3)


def test_a_disaggregated_fleet_prices_the_intake_on_its_prefill_replicas():
    def fleet(intake):
        prefill, decode = [], []
        for kind, out in ((PrefillReplica, prefill), (DecodeReplica, decode)):
            executor = FakeExecutor(60, BLOCK, vocab_size=50)
            replica = kind(0, make_scheduler(CONFIG, executor.info()), executor, SimulatedClock())
            replica.intake = intake if kind is PrefillReplica else None
            out.append(replica)
        return prefill, decode

    class Free:
        def price(self, num_tokens, prefill, decode, overlap_s):
            return 1e-4, num_tokens

    ttft = []
    for intake in (None, Intake(2e-3)):
        requests = _requests([(16, 3, 0.25)])
        router = make_router(RouterConfig("round_robin"), BLOCK)
        run_disaggregated(*fleet(intake), requests, router, router, Free())
        ttft.append(requests[0].first_token_time - requests[0].arrival_time)
    assert ttft[1] == pytest.approx(ttft[0] + 2e-3)


def test_a_stepping_replica_reads_its_pipe_its_poll_lag_after_a_step_ends():
    """A request that reaches the pipe within the loop's lag after a step's end joins the next step
    planned there; an idle replica's loop waits on the pipe, so the lag never makes it early."""
    first_scheduled = {}
    for lag in (0.0, 5e-4):
        requests = _requests([(8, 20, 0.0), (8, 2, 1.5e-3)])
        replica = _fleet(1, Intake(8e-4, 0.0, lag))[0]
        run_fleet([replica], requests, make_router(RouterConfig("round_robin"), BLOCK))
        ends = sorted(s.start_s + s.duration_s for s in replica.result.steps)
        boundary = next(t for t in ends if t >= 1.5e-3)
        assert boundary < 1.5e-3 + 8e-4 <= boundary + lag or lag == 0.0
        first_scheduled[lag] = (requests[1].first_scheduled_time, boundary)
    (without, boundary), (with_lag, _) = first_scheduled[0.0], first_scheduled[5e-4]
    assert with_lag == pytest.approx(boundary) and without > boundary
    (alone,), _ = _serve([(16, 2, 0.5)], 1, Intake(1e-3, 0.0, 5e-4))
    assert alone.first_scheduled_time == pytest.approx(0.5 + 1e-3)
