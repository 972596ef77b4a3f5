"""Data parallelism on CPU: two tiny-model engine replicas, each a process running its own core
loop, behind the router: the single engine's greedy tokens and schedules, rejections reported
while the others are served, and a replica that fails stops the run with one line."""

from __future__ import annotations

import random
import threading
import time

import pytest

from engine.config import EngineConfig
from engine.core import CacheConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.fleet import run_fleet_wall
from engine.core.loop import WallClock, run
from engine.core.routers import RouterConfig, make_router
from engine.worker_loop import WorkerError

pytest.importorskip("torch")

SCHEDULER = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)
CACHE = CacheConfig(block_size=16, num_blocks=64)


def _requests(n=10, prefix="r", online=True):
    rng = random.Random(0)
    return [Request(f"{prefix}{i}", [rng.randrange(1, 500) for _ in range(rng.randrange(4, 60))],
                    SamplingParams(temperature=0.0, max_tokens=rng.randrange(2, 24), ignore_eos=True),
                    arrival_time=0.01 * i if online else 0.0) for i in range(n)]


def _serve(engines, requests, router="round_robin"):
    clock = WallClock()
    engines.start_run(clock)
    return run_fleet_wall(engines, requests, make_router(RouterConfig(router), CACHE.block_size), clock)


@pytest.fixture(scope="module")
def engine_config(tiny_qwen3_dir):
    return EngineConfig(model=str(tiny_qwen3_dir), device="cpu")


@pytest.fixture(scope="module")
def engines(engine_config):
    from engine.replicas import EngineReplicas

    with EngineReplicas([engine_config, engine_config], SCHEDULER, CACHE) as replicas:
        yield replicas


def test_offline_round_robin_gives_the_llms_tokens_and_each_replica_a_single_engines_schedule(
        engines, engine_config, tiny_qwen3_dir):
    from engine import LLM
    from engine.executor import EngineExecutor

    fleet = _serve(engines, _requests(prefix="off", online=False))
    assert set(fleet.assignment.values()) == {0, 1}
    llm = LLM(tiny_qwen3_dir, device="cpu", max_model_len=SCHEDULER.max_model_len)
    try:
        reference = _requests(online=False)
        outputs = llm.generate([r.prompt_token_ids for r in reference], [r.sampling_params for r in reference],
                               use_tqdm=False)
    finally:
        llm.executor.shutdown()
    served = {r.request_id: r.output_token_ids for replica in fleet.replicas for r in replica.requests}
    assert served == {f"off{i}": out.token_ids for i, out in enumerate(outputs)}
    single = EngineExecutor(engine_config, SCHEDULER, CACHE)
    try:
        for index, replica in enumerate(fleet.replicas):
            mine = [r for r in _requests(prefix="off", online=False) if fleet.assignment[r.request_id] == index]
            alone = run(make_scheduler(SCHEDULER, single.info(), CACHE), single, mine, WallClock())
            assert [s.stats for s in replica.steps] == [s.stats for s in alone.steps]
            assert [r.output_token_ids for r in replica.requests] == [r.output_token_ids for r in alone.requests]
    finally:
        single.shutdown()


def test_online_requests_are_served_and_timed_on_the_routers_clock(engines):
    fleet = _serve(engines, _requests(prefix="on"), router="least_requests")
    requests = [r for replica in fleet.replicas for r in replica.requests]
    assert sorted(r.request_id for r in requests) == sorted(f"on{i}" for i in range(10))
    assert all(r.arrival_time <= r.first_token_time <= r.finish_time <= fleet.makespan_s for r in requests)
    assert all(replica.steps and replica.steps[0].start_s >= 0 for replica in fleet.replicas)


def test_a_request_one_replica_rejects_does_not_stop_the_others(engines):
    requests = _requests(6, prefix="rej")
    requests[3] = Request("rej3", [7] * SCHEDULER.max_model_len, SamplingParams(max_tokens=4), arrival_time=0.03)
    fleet = _serve(engines, requests)
    assert list(fleet.replicas[1].rejected) == ["rej3"]
    assert "max_model_len" in fleet.replicas[1].rejected["rej3"]
    served = [[r.request_id for r in replica.requests] for replica in fleet.replicas]
    assert served == [["rej0", "rej2", "rej4"], ["rej1", "rej5"]]


def test_a_replica_that_crashes_stops_the_run_with_one_line_and_no_hang(engine_config):
    from engine.replicas import EngineReplicas

    outcome = {}

    def run_it() -> None:
        with EngineReplicas([engine_config, engine_config], SCHEDULER, CACHE) as engines:
            vocab = engines.infos[1].vocab_size
            requests = _requests(4, prefix="crash")
            requests[1] = Request("crash1", [vocab + 5] * 8, SamplingParams(max_tokens=4), arrival_time=0.01)
            started = time.perf_counter()
            try:
                _serve(engines, requests)
            except WorkerError as error:
                outcome["error"], outcome["after_s"] = error, time.perf_counter() - started

    thread = threading.Thread(target=run_it, daemon=True)
    thread.start()
    thread.join(120.0)
    assert not thread.is_alive(), "the fleet hung after a replica crashed"
    error = outcome["error"]
    assert str(error).startswith("engine replica 2 failed during 'run': IndexError")
    assert "\n" not in str(error) and "Traceback" in error.details
    assert outcome["after_s"] < 30.0


@pytest.mark.slow  # ~30 s on 2 cores: two more processes loading torch
def test_backend_engine_fleet_replicas_two_runs_through_the_harness(tiny_qwen3_dir, tmp_path):
    import pandas as pd

    from harness.study import run_study
    from tests.harness.conftest import compose_config

    overrides = ["model=tiny-qwen3", "backend=engine", f"backend.model={tiny_qwen3_dir}", "backend.device=cpu",
                 "workload=poisson", "workload.rate=50", "workload.num_requests=12", "workload.prompt_len.high=160",
                 "workload.output_len.low=4", "workload.output_len.high=24", "workload.prompt_len.low=20",
                 "scheduler.max_model_len=512", "cache.block_size=16",
                 "cache.num_blocks=64", "fleet.replicas=2", "router=least_requests", "output.plots=false"]
    run_study(compose_config(overrides), tmp_path)
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 12 and set(requests["replica"]) == {0, 1}
    assert (requests["ttft"] > 0).all() and (requests["ttft"] <= requests["e2e"]).all()
    assert pd.read_csv(tmp_path / "summary.csv").iloc[0]["backend"] == "engine"
