"""Fast-forward in disaggregated fleets, static and autoscaled, against the step-by-step path
(tests/sim/test_fast_forward.py has the single replica's and the aggregated fleet's): the same
requests, steps, transfers and, autoscaled, the same signals to each pool's policy, lifetimes and
scale events."""

from __future__ import annotations

import contextlib
import signal

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_elastic import run_disaggregated_elastic
from engine.core.disagg_fleet import run_disaggregated
from engine.core.elastic_states import ColdStart, Scaling
from engine.core.fleet_signal import FleetSignal
from engine.core.loop import SimulatedClock
from engine.core.routers import ROUTER_REGISTRY
from tests.core.test_disagg import LinearPricer
from tests.sim.test_fast_forward import POLICIES, _executor, _requests, _tables


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail, rather than hang, when a fleet loop stops making progress (SIGALRM: POSIX main thread)."""
    def expired(*_):
        raise TimeoutError(f"no result within {seconds} s: the fleet loop made no progress")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.booleans(), st.integers(0, 10**6), st.integers(1, 30), st.integers(1, 2),
       st.integers(1, 2), st.tuples(st.sampled_from([16, 64]), st.booleans(), st.booleans()))
@example("nano", False, 1, 4, 2, 1, (16, False, False))  # KV in transit, a preempted one re-admitted
@example("nano", False, 291933, 28, 1, 1, (16, False, False))  # a first token pushed while a decode run is booked ahead
@example("sjf", True, 870408, 19, 1, 2, (16, False, False))
@example("sjf", False, 740800, 29, 1, 1, (16, True, False))  # a decode replica stalls, a message waiting
@example("sjf", True, 870408, 19, 2, 2, (16, True, True))  # sends wait for prefill steps in flight
def test_fast_forward_matches_step_by_step_in_a_disaggregated_fleet(policy, overlap, seed, n, p, d, decode):
    """Transfers land on decode replicas mid-run (a 1 ms transfer against sub-millisecond steps), and
    16-block decode caches make requests wait for room (back-pressure); handshake: the engine's
    protocol, messages handled at step boundaries (or where a replica stalls: no boundary comes).
    Decode replicas fast-forward (the fast path books runs: checked below), so a run must end where
    a KV lands, where a request waits for a decode replica and before any other replica's next step;
    queue: sends wait for the prefill step in flight."""
    decode_blocks, handshake, queue = decode

    def serve(fast: bool):
        config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=60, policy=policy)

        def pool(kind, count: int, blocks: int):
            executors = [_executor(fast, overlap, blocks) for _ in range(count)]
            return [kind(i, make_scheduler(config, e.info()), e, SimulatedClock()) for i, e in enumerate(executors)]

        prefill, decode = pool(PrefillReplica, p, 64), pool(DecodeReplica, d, decode_blocks)
        assert all(r.runner is not None and r.runner.fast_forwards() == fast for r in decode)
        return _served(prefill, decode, seed, n, LinearPricer(1e-3, 1e-5), handshake, queue)
    assert serve(True) == serve(False)


def _served(prefill, decode, seed: int, n: int, pricer, handshake: bool, queue: bool):
    """The fleet served to its end (a hang fails after 60 s): every replica's tables, each
    request's move (decode replica, start, time) and the most requests blocked at once."""
    routers = [ROUTER_REGISTRY.get("round_robin")() for _ in range(2)]
    with _deadline(60):
        result = run_disaggregated(prefill, decode, _requests(seed, n, 60, False), *routers, pricer,
                                   handshake=handshake, queue_behind_step=queue)
    moves = {rid: (t.decode, t.start_s, t.transfer_s) for rid, t in result.transfers.items()}
    return [_tables(r.result) for r in [*prefill, *decode]], moves, result.max_blocked


def _ring_bound(fast: bool, policy: str, overlap: bool, seed: int, n: int, p: int, handshake: bool, queue: bool):
    """Transfers of 2 ms + 2 ms a token against sub-millisecond steps and decode caches with room:
    the receive staging rings (a peer's: 2 requests of max_model_len) hold transfers back."""
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, max_model_len=60, policy=policy)

    def pool(kind, count: int):
        executors = [_executor(fast, overlap, 200) for _ in range(count)]
        return [kind(i, make_scheduler(config, e.info()), e, SimulatedClock()) for i, e in enumerate(executors)]

    prefill, decode = pool(PrefillReplica, p), pool(DecodeReplica, 1)
    return _served(prefill, decode, seed, n, LinearPricer(2e-3, 2e-3), handshake, queue)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.booleans(), st.integers(0, 10**6), st.integers(1, 30), st.integers(1, 2),
       st.booleans(), st.booleans())
def test_fast_forward_matches_step_by_step_when_staging_rings_hold_transfers_back(policy, overlap, seed, n, p,
                                                                                  handshake, queue):
    args = (policy, overlap, seed, n, p, handshake, queue)
    assert _ring_bound(True, *args) == _ring_bound(False, *args)


def test_staging_rings_hold_transfers_back_in_the_fast_forward_fleet():
    """The fleet above does make transfers wait for ring room (not for decode blocks: 200 each)."""
    _, _, max_blocked = _ring_bound(True, "nano", False, 7, 30, 1, False, False)
    assert max_blocked >= 2


def test_decode_replicas_of_a_disaggregated_fleet_book_runs():
    """Fast-forward is on for decode replicas: a decode-heavy disaggregated run books StepRuns."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=200)
    prefill = [PrefillReplica(0, make_scheduler(config, (e := _executor(True, False, 64)).info()), e, SimulatedClock())]
    decode = [DecodeReplica(0, make_scheduler(config, (e := _executor(True, False, 64)).info()), e, SimulatedClock())]
    requests = [Request(f"r{i}", [1 + i, 2, 3], SamplingParams(max_tokens=150, ignore_eos=True), arrival_time=0.0)
                for i in range(4)]
    routers = [ROUTER_REGISTRY.get("round_robin")() for _ in range(2)]
    with _deadline(60):
        result = run_disaggregated(prefill, decode, requests, *routers, LinearPricer(1e-3, 1e-5))
    steps = decode[0].result.steps
    assert len(result.requests) == 4 and len(steps) > 100
    assert steps.num_runs > 0, "no run was booked"


class _Reading:
    """A policy whose wish is made of everything it reads (any difference in a signal shows in
    the scaling), keeping each signal it was shown."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def desired(self, signal: FleetSignal) -> int:
        self.seen.append(repr(signal))  # repr: a NaN TPOT equals itself
        load = sum(r.running + r.waiting for r in signal.serving) + round(10 * sum(r.kv_used for r in signal.serving))
        return 1 + (load + len(signal.ttfts) + len(signal.waiting_ages) + signal.starting) % 3


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.booleans(), st.integers(0, 10**6), st.integers(1, 40), st.sampled_from([16, 64]),
       st.booleans(), st.sampled_from(["prefill", "decode", "both"]), st.booleans())
@example("nano", False, 534, 9, 16, False, "decode", False)  # a run reports its finishes ahead of another replica's
def test_fast_forward_matches_step_by_step_in_an_autoscaled_disaggregated_fleet(policy, overlap, seed, n, blocks,
                                                                                settle, scaled, queue):
    """Pools that start, drain and stop replicas every few tens of milliseconds (a policy that
    reads every field of its signal): a run stops before each evaluation and each replica's ready
    time as well as the static fleet's bounds, and what the policies read between runs is what
    the step-by-step path shows them."""
    scaling = Scaling(min_replicas=1, max_replicas=3, interval_s=0.03, scale_up_cooldown_s=0.03,
                      scale_down_cooldown_s=0.06, max_scale_down=1, window_s=0.2,
                      cold_start=ColdStart(provision_s=0.02), settle=settle)

    def serve(fast: bool):
        config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=60, policy=policy)

        def maker(kind, num_blocks: int):
            def make(index: int):
                executor = _executor(fast, overlap, num_blocks)
                return kind(index, make_scheduler(config, executor.info()), executor, SimulatedClock())
            return make

        policies = tuple(_Reading() if scaled in (pool, "both") else None for pool in ("prefill", "decode"))
        routers = [ROUTER_REGISTRY.get("round_robin")() for _ in range(2)]
        with _deadline(60):
            result = run_disaggregated_elastic((maker(PrefillReplica, 64), maker(DecodeReplica, blocks)), (1, 1),
                                               _requests(seed, n, 60, False), *routers, LinearPricer(1e-3, 1e-5),
                                               (scaling, scaling), policies, queue_behind_step=queue)
        fleet = result.fleet
        moves = {rid: (t.decode, t.start_s, t.transfer_s) for rid, t in fleet.transfers.items()}
        pools = [(h.lifetimes, h.events) for h in (result.prefill, result.decode)]
        seen = [p.seen for p in policies if p is not None]
        return [_tables(r) for r in [*fleet.prefill, *fleet.decode]], moves, fleet.max_blocked, pools, seen, \
            fleet.makespan_s
    assert serve(True) == serve(False)


def test_decode_replicas_of_an_autoscaled_disaggregated_fleet_book_runs():
    """Fast-forward is on in autoscaled disaggregated fleets: a decode-heavy run books StepRuns."""
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=200)

    def maker(kind):
        def make(index: int):
            executor = _executor(True, False, 64)
            return kind(index, make_scheduler(config, executor.info()), executor, SimulatedClock())
        return make

    requests = [Request(f"r{i}", [1 + i, 2, 3], SamplingParams(max_tokens=150, ignore_eos=True), arrival_time=0.0)
                for i in range(4)]
    scaling = Scaling(1, 2, 0.05, 0.05, 0.1, 1, 0.5, ColdStart(provision_s=0.02))
    routers = [ROUTER_REGISTRY.get("round_robin")() for _ in range(2)]
    with _deadline(60):
        result = run_disaggregated_elastic((maker(PrefillReplica), maker(DecodeReplica)), (1, 1), requests, *routers,
                                           LinearPricer(1e-3, 1e-5), (scaling, scaling), (None, _Reading()))
    assert len(result.fleet.requests) == 4 and result.fleet.decode[0].steps.num_runs > 0, "no run was booked"
