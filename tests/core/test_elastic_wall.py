"""An elastic fleet of replicas that run their own loops (engine.core.elastic_wall), here in threads
over real pipes with fake executors and a start-up the test sets: a replica started mid-run takes
traffic only once it says it is ready, a drained one gets nothing more and stops when its work
ends, every request is served once with a single run's tokens, and with no policy the fleet is
run_fleet_wall's."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import wait

import pytest

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.elastic import ColdStart, FleetSignal, Scaling
from engine.core.elastic_wall import run_elastic_wall
from engine.core.fleet import run_fleet_wall
from engine.core.loop import Replica, SimulatedClock, WallClock, run
from engine.core.remote_replica import serve_replica
from engine.core.routers import RouterConfig, make_router
from engine.worker_loop import serve
from tests.core.fakes import FakeExecutor

BLOCK = 8
CONFIG = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128)


class LaunchingLinks:
    """ElasticLinks to replicas served in threads; a launched one waits startup_s (its load) between
    "hello" and "ready", as a replica process does between its imports and its loaded engine."""

    def __init__(self, initial: int, startup_s: float) -> None:
        self.startup_s = startup_s
        self.conns: list = []
        self.threads: list[threading.Thread] = []
        self.launched_at: list[float] = []
        for _ in range(initial):
            self._start(announce=False)

    def _start(self, announce: bool) -> int:
        index = len(self.conns)
        parent, child = Pipe()
        executor = FakeExecutor(40, BLOCK, vocab_size=50)

        def start():
            if announce:
                child.send(("hello", None))
                time.sleep(self.startup_s)
                child.send(("ready", executor.info()))

            def handle(kind, origin):
                scheduler = make_scheduler(CONFIG, executor.info())
                return serve_replica(Replica(index, scheduler, executor, WallClock(origin)), child)

            return handle

        thread = threading.Thread(target=serve, args=(child, start, lambda: None), daemon=True)
        thread.start()
        self.conns.append(parent)
        self.threads.append(thread)
        self.launched_at.append(time.perf_counter())
        return index

    def launch(self) -> int:
        return self._start(announce=True)

    def __len__(self) -> int:
        return len(self.conns)

    def send(self, index, kind, payload) -> None:
        self.conns[index].send((kind, payload))

    def receive(self, timeout):
        messages = []
        for conn in wait(self.conns, 10.0 if timeout is None else timeout):
            index = self.conns.index(conn)
            while conn.poll():
                messages.append((index, *conn.recv()))
        return messages

    def close(self) -> None:
        for conn in self.conns:
            conn.send(("shutdown", None))
        for thread in self.threads:
            thread.join(5.0)


class Scheduled:
    """The replicas wanted from each time on: [(t, n), ...]."""

    def __init__(self, steps) -> None:
        self.steps = steps

    def desired(self, signal: FleetSignal) -> int:
        return [n for t, n in self.steps if t <= signal.now][-1]


def _requests(n: int, spacing_s: float) -> list[Request]:
    return [Request(f"q{i}", [1 + i % 7] * (10 + i % 13), SamplingParams(max_tokens=4 + i % 5, ignore_eos=True),
                    arrival_time=spacing_s * i) for i in range(n)]


def _scaling(max_replicas: int, startup_s: float) -> Scaling:
    return Scaling(1, max_replicas, interval_s=0.05, scale_up_cooldown_s=0.0, scale_down_cooldown_s=0.0,
                   max_scale_down=1, window_s=1.0, cold_start=ColdStart(load_s=startup_s))


class RoutedAt:
    """A router that notes when, on the fleet's clock, it routed each request: a busy machine delays
    the fleet's loop, so an arrival can be routed well after its arrival time."""

    def __init__(self, router, clock: WallClock) -> None:
        self.router, self.clock = router, clock
        self.times: dict[str, float] = {}

    def route(self, request, replicas) -> int:
        self.times[request.request_id] = self.clock.now()
        return self.router.route(request, replicas)


def _serve(initial, steps, requests, startup_s=0.15, max_replicas=2, router="least_requests"):
    links = LaunchingLinks(initial, startup_s)
    clock = WallClock()
    routed = RoutedAt(make_router(RouterConfig(router), BLOCK), clock)
    try:
        result = run_elastic_wall(links, initial, requests, routed, clock,
                                  _scaling(max_replicas, startup_s), Scheduled(steps) if steps else None)
    finally:
        links.close()
    return result, links, routed.times


def _single_run_tokens(requests):
    executor = FakeExecutor(40, BLOCK, vocab_size=50)
    alone = run(make_scheduler(CONFIG, executor.info()), executor, requests, SimulatedClock())
    return {r.request_id: r.output_token_ids for r in alone.requests}


def test_a_replica_started_mid_run_takes_traffic_only_once_ready():
    # arrivals for 2.4 s: the second replica, asked for at 0.2 s and ready about 0.15 s later, has
    # traffic left to take even where a busy machine delays its threads by over a second (CI has seen
    # it ready after 1.2 s of arrivals had all been routed)
    requests = _requests(240, 0.01)
    result, _, routed_at = _serve(1, [(0.0, 1), (0.2, 2)], requests, router="round_robin")
    fleet, (first, second) = result.fleet, result.lifetimes
    assert [(e.direction, e.replicas) for e in result.events] == [("up", (1,))]
    assert 0.2 <= second.requested_s < 0.3 and first.ready_s == 0.0
    assert second.ready_s - second.requested_s >= 0.15  # its start-up: hello, then ready after the load
    arrivals = {r.request_id: r.arrival_time for r in requests}
    mine = [rid for rid, index in fleet.assignment.items() if index == 1]
    assert mine and min(routed_at[rid] for rid in mine) >= second.ready_s  # routed at or after ready
    served = {r.request_id: r.output_token_ids for replica in fleet.replicas for r in replica.requests}
    assert served == _single_run_tokens(_requests(240, 0.01))
    assert second.stop_s == first.stop_s == fleet.makespan_s >= max(arrivals.values())


def test_a_drained_replica_gets_nothing_more_and_stops_when_its_work_ends():
    requests = _requests(50, 0.01)
    result, _, _ = _serve(2, [(0.0, 2), (0.2, 1)], requests, router="round_robin")
    drained = result.lifetimes[result.events[0].replicas[0]]
    assert [e.direction for e in result.events] == ["down"] and not drained.cancelled
    arrivals = {r.request_id: r.arrival_time for r in requests}
    routed = [arrivals[rid] for rid, index in result.fleet.assignment.items() if index == drained.index]
    assert routed and max(routed) <= drained.drain_s
    assert drained.drain_s <= drained.stop_s < result.fleet.makespan_s
    assert len(result.fleet.assignment) == 50 == sum(len(r.requests) for r in result.fleet.replicas)


def test_a_replica_still_starting_when_the_run_ends_never_serves_and_is_billed_to_the_end():
    result, _, _ = _serve(1, [(0.0, 1), (0.1, 2)], _requests(20, 0.01), startup_s=0.6)
    late = result.lifetimes[1]
    assert late.ready_s == float("inf") and late.stop_s == result.fleet.makespan_s
    assert set(result.fleet.assignment.values()) == {0}


@pytest.mark.parametrize("router", ["round_robin", "least_requests"])
def test_without_a_policy_it_serves_as_the_static_wall_fleet(router):
    requests = _requests(30, 0.0)
    result, _, _ = _serve(2, None, requests, router=router)
    links = LaunchingLinks(2, 0.0)
    clock = WallClock()
    try:
        for index in range(2):
            links.send(index, "run", clock.origin)
        static = run_fleet_wall(links, _requests(30, 0.0), make_router(RouterConfig(router), BLOCK), clock)
    finally:
        links.close()
    assert result.fleet.assignment == static.assignment and result.events == []
    assert [[r.output_token_ids for r in x.requests] for x in result.fleet.replicas] == \
        [[r.output_token_ids for r in x.requests] for x in static.replicas]
