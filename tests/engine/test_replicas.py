"""Data parallelism on CPU: two tiny-model engine replicas, each in its own process, behind the
router serve every request with the tokens a single engine gives the same requests (greedy)."""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.core import CacheConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.fleet import run_fleet_wall
from engine.core.loop import Replica
from engine.core.loop import WallClock, run
from engine.core.routers import RouterConfig, make_router

pytest.importorskip("torch")

SCHEDULER = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)
CACHE = CacheConfig(block_size=16, num_blocks=64)


def _requests(n=10):
    rng = random.Random(0)
    return [Request(f"r{i}", [rng.randrange(1, 500) for _ in range(rng.randrange(4, 60))],
                    SamplingParams(temperature=0.0, max_tokens=rng.randrange(2, 24), ignore_eos=True),
                    arrival_time=0.01 * i) for i in range(n)]


def test_two_cpu_replicas_serve_every_request_with_the_single_engines_tokens(tiny_qwen3_dir):
    router = "round_robin"
    from engine.executor import EngineExecutor
    from engine.replicas import start_engine_replicas, wait_any

    engine = EngineConfig(model=str(tiny_qwen3_dir), device="cpu")
    single = EngineExecutor(engine, SCHEDULER, CACHE)
    try:
        expected = run(make_scheduler(SCHEDULER, single.info(), CACHE), single, _requests(), WallClock())
    finally:
        single.shutdown()
    clients = start_engine_replicas([engine, engine], SCHEDULER, CACHE)
    try:
        clock = WallClock()
        replicas = [Replica(i, make_scheduler(SCHEDULER, c.info(), CACHE), c, clock)
                    for i, c in enumerate(clients)]
        fleet = run_fleet_wall(replicas, _requests(), make_router(RouterConfig(router), CACHE.block_size), clock,
                               wait_any)
    finally:
        for client in clients:
            client.shutdown()
    served = {r.request_id: r.output_token_ids for replica in fleet.replicas for r in replica.requests}
    assert served == {r.request_id: r.output_token_ids for r in expected.requests}
    assert set(fleet.assignment.values()) == {0, 1}
    assert all(replica.steps for replica in fleet.replicas)


@pytest.mark.slow  # ~30 s on 2 cores: two more processes loading torch
def test_backend_engine_fleet_replicas_two_runs_through_the_harness(tiny_qwen3_dir, tmp_path):
    import pandas as pd

    from harness.study import run_study
    from tests.harness.conftest import compose_config

    overrides = ["model=tiny-qwen3", "backend=engine", f"backend.model={tiny_qwen3_dir}", "backend.device=cpu",
                 "workload=poisson", "workload.rate=50", "workload.num_requests=12", "workload.prompt_len.high=160",
                 "workload.output_len.low=4", "workload.output_len.high=24", "workload.prompt_len.low=20", "scheduler.max_model_len=512", "cache.block_size=16",
                 "cache.num_blocks=64", "fleet.replicas=2", "router=least_requests", "output.plots=false"]
    run_study(compose_config(overrides), tmp_path)
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 12 and set(requests["replica"]) == {0, 1}
    assert (requests["ttft"] > 0).all() and (requests["ttft"] <= requests["e2e"]).all()
    assert pd.read_csv(tmp_path / "summary.csv").iloc[0]["backend"] == "engine"
