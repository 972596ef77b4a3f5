"""Fast-forward (engine.core.fast_forward) against the step-by-step path, the reference.

Over random workloads (arrivals, shared prefixes, stop tokens, tight caches that preempt), every
policy, plain and overlapped steps, with and without the prefix cache, a single replica and a
fleet (disaggregated fleets: test_fast_forward_disagg.py): each request ends with the same tokens,
timestamps and counters, every step with the same record, bit for bit, and the block manager in
the same state.
"""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.core import Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.executor import BackendInfo
from engine.core.fleet import run_fleet
from engine.core.loop import Replica, SimulatedClock, run
from engine.core.routers import ROUTER_REGISTRY
from sim import sampled as sim_sampled
from sim.executor import SimExecutor
from sim.features import routing_sequences
from sim.roofline import RooflineCostModel
from tests.sim import helpers

POLICIES = ("nano", "mixed", "sjf")


def _executor(fast: bool, overlap: bool, num_blocks: int, cost_model=None, block_size: int = 4) -> SimExecutor:
    model, hardware = helpers.model("qwen3-0.6b"), helpers.hardware("h100")
    info = BackendInfo(num_blocks=num_blocks, block_size=block_size, vocab_size=97, eos_token_ids=(5,),
                       overlaps_steps=overlap)
    # plan_after_launches: the launches a cost model prices (_Launches) delay plans, step by step and booked
    return SimExecutor(cost_model or RooflineCostModel(model, hardware), info, seed=3, fast_forward=fast,
                       plan_after_launches=True)


def _requests(seed: int, n: int, max_len: int, stop: bool, packed: bool = False) -> list[Request]:
    """packed: prompts as array("q") (the simulator's requests, engine.core.request.TokenIds)."""
    rng = random.Random(seed)
    shared = [rng.randrange(97) for _ in range(12)]
    requests, t = [], 0.0
    for i in range(n):
        prompt = (shared[: rng.choice((0, 8, 12))] + [rng.randrange(97) for _ in range(rng.randint(1, 20))])
        max_tokens = rng.randint(1, max_len - len(prompt) - 1)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=rng.random() < 0.5,
                                stop_token_ids=[rng.randrange(97)] if stop and rng.random() < 0.2 else [])
        t += rng.expovariate(1 / 0.02) if rng.random() < 0.7 else 0.0
        requests.append(Request(f"r{i}", array("q", prompt) if packed else prompt, params, arrival_time=t))
    return requests


def _tables(result) -> tuple:
    """A run's requests and steps, as compared."""
    requests = [(r.request_id, tuple(r.token_ids), r.first_token_time, r.finish_time, r.first_scheduled_time,
                 r.finish_reason, r.num_preemptions, r.num_cached_tokens, r.num_recomputed_tokens)
                for r in result.requests]
    return requests, [(s.start_s, s.duration_s, s.stats, s.idle_s) for s in result.steps]


def _state(result, scheduler) -> tuple:
    bm = scheduler.block_manager
    return *_tables(result), result.rejected, result.makespan_s, bm.hits, bm.misses, bm.evictions, \
        sorted(bm.key_to_block.items()), list(bm.free_pool)


class _Stateful:
    """A cost model priced step by step with state (as the profiled model's overlap is): each price
    depends on how many steps were priced since the device last drained, so a step priced that the
    step-by-step path never prices, or priced out of order, shows in the clock."""

    def __init__(self) -> None:
        self.inner = RooflineCostModel(helpers.model("qwen3-0.6b"), helpers.hardware("h100"))
        self.since_drained = 0

    def step_time(self, plan):
        self.since_drained += 1
        return self.inner.step_time(plan) * (1.0 + 0.01 * (self.since_drained % 7))

    def drained(self) -> None:
        self.since_drained = 0


class _Repeats(_Stateful):
    """The same, with decode_repeats (priced one at a time, no arrays)."""

    def decode_repeats(self, plan):
        for duration in self.inner.decode_repeats(plan):
            self.since_drained += 1
            yield duration * (1.0 + 0.01 * (self.since_drained % 7))


class _Grouped(_Stateful):
    """Priced by the step's routing groups (sim.features.routing_sequences, by each entry's
    prefix_key), so a booked repeat whose entries lost their keys prices differently."""

    def step_time(self, plan):
        keyless = sum(e.prefix_key is None for e in plan.scheduled)
        return super().step_time(plan) * (1.0 + 0.01 * len(routing_sequences(plan)) + 0.001 * keyless)


class _Launches(_Stateful):
    """With each step's launches (the executor's host_s, as ProfiledCostModel.last_launch_s): a
    prefill's outlast the steps around it, so the loop plans the next step after them
    (Replica.plan_time), arrivals meanwhile join it, and a booked run closes there."""

    def step_time(self, plan):
        duration = super().step_time(plan)
        self.last_launch_s = 0.004 * (1 + self.since_drained % 4) if plan.stats.kind != "decode" else duration
        return duration


COST_MODELS = {"roofline": None, "stateful": _Stateful, "repeats": _Repeats, "grouped": _Grouped,
               "launches": _Launches}


def _serve(fast, policy, overlap, caching, num_blocks, seed, n, stop, max_num_seqs, cost="roofline", block_size=4,
           max_len=60, packed=False):
    make = COST_MODELS[cost]
    executor = _executor(fast, overlap, num_blocks, make() if make else None, block_size)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=max_len,
                             policy=policy)
    scheduler = make_scheduler(config, executor.info())
    scheduler.block_manager.enable_prefix_caching = caching
    result = run(scheduler, executor, _requests(seed, n, max_len, stop, packed), SimulatedClock())
    return _state(result, scheduler)


# The single replica's whole space: policy, overlap, prefix cache, blocks, seed, requests, stop tokens,
# max_num_seqs, packed ids. The default run draws 200 cases (~3 s); the slow suite searches 1000.
SINGLE_REPLICA = given(st.sampled_from(POLICIES), st.booleans(), st.booleans(), st.integers(16, 80),
                       st.integers(0, 10**6), st.integers(1, 30), st.booleans(), st.integers(1, 8), st.booleans())


def _check_single_replica(policy, overlap, caching, num_blocks, seed, n, stop, max_num_seqs, packed):
    """packed: the fast path's requests hold packed ids, the reference's lists."""
    args = (policy, overlap, caching, num_blocks, seed, n, stop, max_num_seqs)
    assert _serve(True, *args, packed=packed) == _serve(False, *args)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@SINGLE_REPLICA
# overlapped: a request joins the run as its prefill lands and leaves at once, its blocks freed
# before that token is known; the block it fills is offered when it lands, as step by step
@example("nano", True, True, 18, 1707, 12, False, 4, False)
def test_fast_forward_matches_step_by_step(policy, overlap, caching, num_blocks, seed, n, stop, max_num_seqs, packed):
    _check_single_replica(policy, overlap, caching, num_blocks, seed, n, stop, max_num_seqs, packed)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@SINGLE_REPLICA
def test_fast_forward_matches_step_by_step_searched_longer(policy, overlap, caching, num_blocks, seed, n, stop,
                                                           max_num_seqs, packed):
    _check_single_replica(policy, overlap, caching, num_blocks, seed, n, stop, max_num_seqs, packed)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(("roofline", "stateful", "launches")), st.sampled_from(POLICIES), st.booleans(), st.booleans(),
       st.integers(4, 40), st.integers(0, 10**6), st.integers(1, 16), st.integers(1, 8), st.booleans())
def test_long_runs_between_events_match_step_by_step(cost, policy, overlap, caching, num_blocks, seed, n, max_num_seqs,
                                                     packed):
    """Blocks of 64 tokens and outputs of up to 300: runs of many steps between events, which the
    roofline prices and times in arrays (a few steps one by one, then numpy)."""
    args = (policy, overlap, caching, num_blocks, seed, n, False, max_num_seqs, cost, 64, 400)
    assert _serve(True, *args, packed=packed) == _serve(False, *args)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(("stateful", "repeats", "grouped", "launches")), st.sampled_from(POLICIES), st.booleans(),
       st.booleans(), st.integers(16, 80), st.integers(0, 10**6), st.integers(1, 30), st.integers(1, 8))
def test_fast_forward_with_steps_priced_one_at_a_time_matches_step_by_step(cost, policy, overlap, caching, num_blocks,
                                                                          seed, n, max_num_seqs):
    """Cost models without price arrays (decode_repeats, or a plan per step): the run never prices a
    step the step-by-step path does not, and prices them in its order."""
    args = (policy, overlap, caching, num_blocks, seed, n, False, max_num_seqs, cost)
    assert _serve(True, *args) == _serve(False, *args)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.booleans(), st.integers(0, 10**6), st.integers(1, 30),
       st.sampled_from(("round_robin", "least_requests", "least_tokens")), st.sampled_from(("roofline", "launches")))
def test_fast_forward_matches_step_by_step_in_a_fleet(policy, overlap, seed, n, router, cost):
    """Routers read replicas between booked steps: least_tokens reads requests' counts, so a booked
    run writes them out first (Replica.settle); the others read what a run keeps exact."""
    def serve(fast: bool):
        replicas = []
        for i in range(2):
            make = COST_MODELS[cost]
            executor = _executor(fast, overlap, 64, make() if make else None)
            config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=60, policy=policy)
            replicas.append(Replica(i, make_scheduler(config, executor.info()), executor, SimulatedClock()))
        result = run_fleet(replicas, _requests(seed, n, 60, False), ROUTER_REGISTRY.get(router)())
        return [_tables(r.result) for r in replicas], result.makespan_s
    assert serve(True) == serve(False)


def test_fast_forward_books_long_decode_runs_at_once():
    """A decode-heavy run books most of its steps fast: the executor prices few plans."""
    counted = []

    class Counting(RooflineCostModel):
        def step_time(self, plan):
            counted.append(plan.stats.step)
            return super().step_time(plan)

    model, hardware = helpers.model("qwen3-0.6b"), helpers.hardware("h100")
    for fast in (True, False):
        counted.clear()
        executor = _executor(fast, False, 600, Counting(model, hardware))
        config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=600)
        scheduler = make_scheduler(config, executor.info())
        requests = [Request(f"r{i}", [i + 1] * 20, SamplingParams(max_tokens=500, ignore_eos=True)) for i in range(4)]
        result = run(scheduler, executor, requests, SimulatedClock())
        assert len(result.steps) == 500
        assert len(counted) == (2 if fast else 500)  # the prefill and the first decode step: the run books the rest


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_fast_forward_setting_is_a_bool(value):
    from sim.config import SimConfig

    with pytest.raises(ValueError, match="fast_forward"):
        SimConfig(fast_forward=value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.booleans(), st.integers(16, 80), st.integers(0, 10**6), st.integers(1, 30),
       st.booleans())
def test_fast_forward_with_every_run_hashed_in_numpy_matches_step_by_step(policy, overlap, num_blocks, seed, n, packed):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sim_sampled, "VECTOR_TOKENS", 1)  # sample_runs' numpy path (hash_runs), however short the run
        args = (policy, overlap, True, num_blocks, seed, n, False, 4)
        assert _serve(True, *args, packed=packed) == _serve(False, *args)


@pytest.mark.parametrize("overlap", [False, True])
def test_arrivals_join_a_booked_run(overlap):
    """Requests arriving while a run is booked are prefilled (nano plans prefills apart) and join
    it: the executor prices a plan for each prefill and for the first decode step only."""
    counted = []

    class Counting(RooflineCostModel):
        def step_time(self, plan):
            counted.append(plan.stats.kind)
            return super().step_time(plan)

    model, hardware = helpers.model("qwen3-0.6b"), helpers.hardware("h100")
    results = {}
    for fast in (True, False):
        counted.clear()
        executor = _executor(fast, overlap, 600, Counting(model, hardware))
        scheduler = make_scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=600),
                                   executor.info())
        requests = [Request(f"r{i}", [i + 1] * 20, SamplingParams(max_tokens=300, ignore_eos=True),
                            arrival_time=0.05 * i) for i in range(5)]
        result = run(scheduler, executor, requests, SimulatedClock())
        results[fast] = _state(result, scheduler)
        if fast:
            assert counted == ["prefill", "decode"] + ["prefill"] * 4
    assert results[True] == results[False]
