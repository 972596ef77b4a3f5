"""Replicas that run their own loops (engine.core.remote_replica) behind the wall-clock router
(engine.core.fleet.run_fleet_wall), here in threads over real pipes with fake executors: every
request served once with a single run's tokens, each replica's schedule a single run's, the
router's view of the loads, rejections reported, failures raised."""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from multiprocessing.connection import wait

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.fleet import run_fleet, run_fleet_wall
from engine.core.loop import Replica, SimulatedClock, WallClock, run, tokens_left
from engine.core.remote_replica import ReplicaView, Report, serve_replica
from engine.core.routers import ROUTERS, RouterConfig, make_router
from engine.worker_loop import WorkerError, error_line, serve
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor

BLOCK = 8
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128)


class ThreadLinks:
    """ReplicaLinks to replicas served in threads (serve() and serve_replica(), as a replica
    process runs them), over multiprocessing pipes."""

    def __init__(self, executors) -> None:
        self.conns, self.threads = [], []
        for index, executor in enumerate(executors):
            parent, child = Pipe()
            thread = threading.Thread(target=serve, args=(child, self._starter(index, executor, child), lambda: None),
                                      daemon=True)
            thread.start()
            self.conns.append(parent)
            self.threads.append(thread)

    @staticmethod
    def _starter(index, executor, conn):
        def handle(kind, origin):
            scheduler = make_scheduler(CONFIG, executor.info())
            return serve_replica(Replica(index, scheduler, executor, WallClock(origin)), conn)

        return lambda: handle

    def __len__(self) -> int:
        return len(self.conns)

    def send(self, index, kind, payload) -> None:
        try:
            self.conns[index].send((kind, payload))
        except OSError:
            pass  # the replica is gone: receive() reports why

    def receive(self, timeout):
        messages = []
        for conn in wait(self.conns, 10.0 if timeout is None else timeout):
            index = self.conns.index(conn)
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "error":
                    raise WorkerError(f"replica {index} failed: {error_line(payload)}", payload)
                messages.append((index, kind, payload))
        return messages

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("shutdown", None))
            except OSError:
                pass  # that replica already stopped (it failed)
        for thread in self.threads:
            thread.join(5.0)


def serve_remote(executors, requests, router_name="round_robin"):
    links = ThreadLinks(executors)
    clock = WallClock()
    try:
        for index in range(len(links)):
            links.send(index, "run", clock.origin)
        return run_fleet_wall(links, requests, make_router(RouterConfig(router_name), BLOCK), clock)
    finally:
        links.close()


def _requests(specs):
    return [Request(f"q{i}", p, SamplingParams(max_tokens=m, ignore_eos=True), arrival_time=t)
            for i, (p, m, t) in enumerate(specs)]


@st.composite
def arrivals(draw, max_requests=16, online=True):
    """(prompt, max_tokens, arrival) per request; prompts may share a first block."""
    specs = []
    for _ in range(draw(st.integers(1, max_requests))):
        head = [draw(st.integers(0, 2))] * BLOCK
        tail = draw(st.lists(st.integers(10, 40), max_size=20))
        arrival = draw(st.floats(0, 0.02, allow_nan=False)) if online else 0.0
        specs.append((head + tail, draw(st.integers(1, 12)), arrival))
    return specs


def _executors(n, kind):
    return [kind(40, BLOCK, vocab_size=50) for _ in range(n)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(), st.integers(1, 3), st.sampled_from(ROUTERS),
       st.sampled_from([FakeExecutor, OverlappingFakeExecutor]))
def test_every_request_is_served_once_with_the_tokens_a_single_run_gives(specs, n, router_name, kind):
    fleet = serve_remote(_executors(n, kind), _requests(specs), router_name)
    single = _executors(1, kind)[0]
    expected = run(make_scheduler(CONFIG, single.info()), single, _requests(specs), SimulatedClock())
    served = {r.request_id: r.output_token_ids for replica in fleet.replicas for r in replica.requests}
    assert served == {r.request_id: r.output_token_ids for r in expected.requests}
    for index, replica in enumerate(fleet.replicas):
        assert all(fleet.assignment[r.request_id] == index for r in replica.requests)
        assert all(r.first_token_time <= r.finish_time <= replica.makespan_s for r in replica.requests)
        assert [s.stats.step for s in replica.steps] == sorted(s.stats.step for s in replica.steps)
    assert fleet.makespan_s == max(r.makespan_s for r in fleet.replicas)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals(online=False), st.integers(1, 3), st.sampled_from(ROUTERS),
       st.sampled_from([FakeExecutor, OverlappingFakeExecutor]))
def test_offline_each_replica_runs_the_single_run_of_its_requests_routed_as_the_simulated_fleet(
        specs, n, router_name, kind):
    fleet = serve_remote(_executors(n, kind), _requests(specs), router_name)
    simulated = run_fleet([Replica(i, make_scheduler(CONFIG, e.info()), e, SimulatedClock())
                           for i, e in enumerate(_executors(n, kind))],
                          _requests(specs), make_router(RouterConfig(router_name), BLOCK))
    assert fleet.assignment == simulated.assignment  # the router saw the same loads
    for index, replica in enumerate(fleet.replicas):
        mine = [r for r in _requests(specs) if fleet.assignment[r.request_id] == index]
        executor = _executors(1, kind)[0]
        alone = run(make_scheduler(CONFIG, executor.info()), executor, mine, SimulatedClock())
        assert [s.stats for s in replica.steps] == [s.stats for s in alone.steps]
        assert [r.output_token_ids for r in replica.requests] == [r.output_token_ids for r in alone.requests]


def test_a_rejected_request_is_reported_and_the_others_are_served():
    specs = [([1] * 20, 4, 0.0), ([2] * 200, 4, 0.0), ([3] * 20, 4, 0.001), ([4] * 20, 4, 0.002)]
    fleet = serve_remote(_executors(2, OverlappingFakeExecutor), _requests(specs))
    assert list(fleet.replicas[1].rejected) == ["q1"]
    assert "max_model_len" in fleet.replicas[1].rejected["q1"]
    assert [[r.request_id for r in replica.requests] for replica in fleet.replicas] == [["q0", "q2"], ["q3"]]
    assert all(r.num_output_tokens == 4 for replica in fleet.replicas for r in replica.requests)


class _Broken(FakeExecutor):
    def _compute(self, plan):
        if any(e.request_id == "bad" for e in plan.scheduled):
            raise RuntimeError("device fault")
        return super()._compute(plan)


def test_a_replica_that_fails_stops_the_run_with_a_one_line_error():
    requests = [Request("good", [1] * 10, SamplingParams(max_tokens=50, ignore_eos=True)),
                Request("bad", [2] * 10, SamplingParams(max_tokens=5, ignore_eos=True), arrival_time=0.001)]
    with pytest.raises(WorkerError) as failure:
        serve_remote([FakeExecutor(40, BLOCK, vocab_size=50), _Broken(40, BLOCK, vocab_size=50)], requests)
    assert str(failure.value).startswith("replica 1 failed: RuntimeError: device fault (core/test_remote_fleet.py:")
    assert "\n" not in str(failure.value) and "Traceback" in failure.value.details


def test_the_view_counts_dispatched_requests_until_reported_and_tokens_from_the_latest_report():
    view = ReplicaView()
    a, b, c = (Request(x, [1] * 10, SamplingParams(max_tokens=5)) for x in "abc")
    for request in (a, b, c):
        view.dispatched(request)
    assert view.outstanding_requests() == 3 and view.outstanding_tokens() == 45
    # the replica had taken a and b when it reported: a finished, b has 7 tokens left
    view.reported(Report([], [a], {}, num_received=2, outstanding_tokens=7))
    assert view.outstanding_requests() == 2 and view.outstanding_tokens() == 7 + tokens_left(c)
    view.reported(Report([], [], {"c": "too long"}, num_received=3, outstanding_tokens=3))
    assert view.outstanding_requests() == 1 and view.outstanding_tokens() == 3
