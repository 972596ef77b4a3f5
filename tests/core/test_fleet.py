"""The fleet loop and the routers: every request served once, a fleet of one is a single run,
round-robin balances, prefix-affinity keeps a shared prefix on one replica."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.fleet import run_fleet
from engine.core.loop import Replica, SimulatedClock, run
from engine.core.routers import ROUTERS, RouterConfig, make_router
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor

BLOCK = 8
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128)


@st.composite
def arrivals(draw, max_requests=24):
    """(prompt tokens, max_tokens, arrival time) per request; prompts may share a first block."""
    n = draw(st.integers(1, max_requests))
    heads = [[h] * BLOCK for h in range(3)]
    specs = []
    for _ in range(n):
        head = draw(st.sampled_from(heads))
        tail = draw(st.lists(st.integers(10, 40), min_size=0, max_size=20))
        specs.append((head + tail, draw(st.integers(1, 12)), draw(st.floats(0, 0.05, allow_nan=False))))
    return specs


def _requests(specs):
    return [Request(f"q{i}", p, SamplingParams(max_tokens=m, ignore_eos=True), arrival_time=t)
            for i, (p, m, t) in enumerate(specs)]


def _fleet(n, executor_class=FakeExecutor, num_blocks=40):
    replicas = []
    for i in range(n):
        executor = executor_class(num_blocks, BLOCK, vocab_size=50)
        replicas.append(Replica(i, make_scheduler(CONFIG, executor.info()), executor, SimulatedClock()))
    return replicas


def _rows(result):
    return [(r.request_id, tuple(r.token_ids), r.first_token_time, r.finish_time, r.num_preemptions)
            for r in result.requests]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.integers(1, 4), st.sampled_from(ROUTERS))
def test_every_request_is_served_exactly_once(specs, n, router_name):
    requests = _requests(specs)
    result = run_fleet(_fleet(n), requests, make_router(RouterConfig(router_name), BLOCK))
    served = [r.request_id for replica in result.replicas for r in replica.requests]
    assert sorted(served) == sorted(r.request_id for r in requests)
    for index, replica in enumerate(result.replicas):
        assert all(result.assignment[r.request_id] == index for r in replica.requests)
    assert all(r.num_output_tokens == r.max_tokens for r in requests)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.sampled_from(ROUTERS), st.sampled_from([FakeExecutor, OverlappingFakeExecutor]))
def test_a_fleet_of_one_replays_the_single_run(specs, router_name, executor_class):
    single_exec = executor_class(40, BLOCK, vocab_size=50)
    single = run(make_scheduler(CONFIG, single_exec.info()), single_exec, _requests(specs), SimulatedClock())
    replicas = _fleet(1, executor_class)
    fleet = run_fleet(replicas, _requests(specs), make_router(RouterConfig(router_name), BLOCK))
    (only,) = fleet.replicas
    assert _rows(only) == _rows(single)
    assert [(s.start_s, s.duration_s, s.stats) for s in only.steps] == \
        [(s.start_s, s.duration_s, s.stats) for s in single.steps]
    assert only.makespan_s == single.makespan_s == fleet.makespan_s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.integers(1, 5))
def test_round_robin_balances_counts_within_one(specs, n):
    result = run_fleet(_fleet(n), _requests(specs), make_router(RouterConfig("round_robin"), BLOCK))
    counts = [list(result.assignment.values()).count(i) for i in range(n)]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.integers(2, 4))
def test_prefix_affinity_keeps_a_shared_first_block_on_one_replica(specs, n):
    requests = _requests(specs)
    router = make_router(RouterConfig("prefix_affinity", prefix_blocks=1, max_imbalance=10_000), BLOCK)
    result = run_fleet(_fleet(n), requests, router)
    by_head: dict[int, set[int]] = {}
    for request in requests:
        by_head.setdefault(request.token_ids[0], set()).add(result.assignment[request.request_id])
    assert all(len(replicas) == 1 for replicas in by_head.values())


def test_prefix_affinity_falls_back_to_the_least_loaded_replica_when_overloaded():
    requests = [Request(f"q{i}", [1] * BLOCK + [20 + i], SamplingParams(max_tokens=50, ignore_eos=True))
                for i in range(6)]
    router = make_router(RouterConfig("prefix_affinity", max_imbalance=2), BLOCK)
    result = run_fleet(_fleet(2, num_blocks=200), requests, router)
    counts = [list(result.assignment.values()).count(i) for i in range(2)]
    # all six share the first block: the target takes one whenever it leads by fewer than two
    # (1-0, 2-0: shed, 2-1, 3-1: shed, 3-2, 4-2), the other replica gets the rest
    assert sorted(counts) == [2, 4]
    target = router.affinity(requests[0], 2)
    assert counts[target] == 4


def test_least_tokens_sends_a_request_away_from_the_replica_with_more_work():
    long = Request("long", [5] * 40, SamplingParams(max_tokens=80, ignore_eos=True))
    shorts = [Request(f"s{i}", [6 + i] * 4, SamplingParams(max_tokens=2, ignore_eos=True)) for i in range(3)]
    result = run_fleet(_fleet(2, num_blocks=200), [long, *shorts], make_router(RouterConfig("least_tokens"), BLOCK))
    assert {result.assignment[r.request_id] for r in shorts} == {1 - result.assignment["long"]}


def test_unknown_router_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"router.name must be one of .*round_robin.*got 'random'"):
        RouterConfig("random")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.integers(2, 3), st.sampled_from(ROUTERS),
       st.sampled_from([FakeExecutor, OverlappingFakeExecutor]))
def test_each_simulated_replica_runs_the_single_run_of_the_requests_routed_to_it(specs, n, router_name, kind):
    """Steps overlap (or not) in a fleet's replica as in a single run: routing only picks the inbox."""
    fleet = run_fleet(_fleet(n, kind), _requests(specs), make_router(RouterConfig(router_name), BLOCK))
    for index, replica in enumerate(fleet.replicas):
        executor = kind(40, BLOCK, vocab_size=50)
        mine = [r for r in _requests(specs) if fleet.assignment[r.request_id] == index]
        alone = run(make_scheduler(CONFIG, executor.info()), executor, mine, SimulatedClock())
        assert _rows(replica) == _rows(alone)
        assert [(s.start_s, s.duration_s, s.stats) for s in replica.steps] == \
            [(s.start_s, s.duration_s, s.stats) for s in alone.steps]


def _global_clock_fleet(replicas, requests, router):
    """The fleet loop as one global event clock: always tick the replica whose next iteration
    starts earliest; route an arrival once every replica's next iteration starts at or after it.
    run_fleet runs each replica up to the next arrival instead; it must give the same fleet."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    assignment = {}
    next_arrival = 0
    while True:
        times = [replica.next_event_time() for replica in replicas]
        earliest = min(range(len(replicas)), key=times.__getitem__)
        if next_arrival < len(pending) and pending[next_arrival].arrival_time <= times[earliest]:
            request = pending[next_arrival]
            assignment[request.request_id] = router.route(request, replicas)
            replicas[assignment[request.request_id]].inbox.append(request)
            next_arrival += 1
        elif times[earliest] == float("inf"):
            return assignment
        else:
            replicas[earliest].tick()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.integers(1, 4), st.sampled_from(ROUTERS),
       st.sampled_from([FakeExecutor, OverlappingFakeExecutor]), st.integers(12, 40))
def test_running_each_replica_to_the_next_arrival_is_the_global_event_clock(specs, n, router_name, executor_class,
                                                                             num_blocks):
    fleet = run_fleet(_fleet(n, executor_class, num_blocks), _requests(specs),
                      make_router(RouterConfig(router_name), BLOCK))
    replicas = _fleet(n, executor_class, num_blocks)
    assignment = _global_clock_fleet(replicas, _requests(specs), make_router(RouterConfig(router_name), BLOCK))
    assert fleet.assignment == assignment
    for ours, theirs in zip(fleet.replicas, replicas):
        assert sorted(_rows(ours)) == sorted(_rows(theirs.result))
        assert [(s.start_s, s.duration_s, s.stats) for s in ours.steps] == \
            [(s.start_s, s.duration_s, s.stats) for s in theirs.result.steps]
