"""A simulated disaggregated replica's KV cache is what the engine plans for the same fleet: the
planned blocks less the KV link staging the engine's replica spec keeps out of its cache
(engine.replica_main.ReplicaSpec.kv_staging_blocks), static and autoscaled; a pinned
cache.num_blocks is the cache itself, as the engine takes it."""

from __future__ import annotations

import pytest

from engine.replicas import replica_specs
from harness.autoscale.config import SLO, AutoscaleConfig
from harness.autoscale.disagg import pool_autoscale, run_disagg_autoscaled
from harness.config import RunConfig, build_run_config
from harness.fleet.config import build_fleet
from harness.fleet.disagg import run_disagg_once
from harness.fleet.disagg_config import build_disagg, pool_run_configs
from sim import plan_num_blocks
from tests.harness.conftest import compose_config

SMALL = ["fleet=disaggregated", "workload=poisson", "workload.num_requests=20", "workload.rate=20",
         "workload.prompt_len.high=400", "workload.output_len.high=100", "output.plots=false"]
MIXED = ["fleet.prefill_replicas=2", "fleet.decode.tp_size=2"]  # two prefill peers of another TP size


def _unstaged(pool: RunConfig) -> int:
    return plan_num_blocks(pool.model.with_kv_cache(pool.cache.kv_cache_dtype), pool.hardware, pool.cache.block_size,
                           pool.sim.execution.gpu_memory_utilization, pool.sim.activation_reserve_bytes,
                           pool.sim.execution.tensor_parallel_size, pool.scheduler.max_num_batched_tokens,
                           pool.scheduler.max_num_seqs)


def _engine_staging(overrides: list[str], counts: tuple[int, int]) -> tuple[int, int]:
    """What the engine's prefill and decode replicas of this fleet keep for staging."""
    rc = build_run_config(compose_config([*overrides, "backend=engine"]))
    pools = pool_run_configs(rc, build_disagg(compose_config(overrides)))
    specs = replica_specs([pools[0].engine] * counts[0] + [pools[1].engine] * counts[1], rc.scheduler, rc.cache,
                          counts[0])
    return specs[0].kv_staging_blocks, specs[-1].kv_staging_blocks


def _sim(overrides: list[str]):
    cfg = compose_config(overrides)
    rc = build_run_config(cfg)
    fleet = build_disagg(cfg)
    engine_rc = build_run_config(compose_config([*overrides, "backend=engine"]))
    assert (rc.scheduler.max_model_len, rc.cache.block_size) == (engine_rc.scheduler.max_model_len,
                                                                 engine_rc.cache.block_size)
    return rc, fleet, build_fleet(cfg, with_fleet=False)[1], pool_run_configs(rc, fleet)


def test_a_simulated_replica_keeps_the_engines_staging_out_of_its_cache():
    rc, fleet, router, pools = _sim([*SMALL, *MIXED])
    outcome = run_disagg_once(rc, fleet, router, progress=False)
    prefill, decode = _engine_staging([*SMALL, *MIXED], (2, 1))
    # a prefill replica stages for its decode peer, twice over for the TP mix; the decode one for both prefill peers
    max_blocks = -(-rc.scheduler.max_model_len // rc.cache.block_size)
    assert (prefill, decode) == (2 * max_blocks * 2, 2 * (2 * max_blocks * 2))
    assert outcome.pool_blocks == {"prefill": [_unstaged(pools[0]) - prefill] * 2,
                                   "decode": [_unstaged(pools[1]) - decode]}
    assert len(outcome.requests) == 20


def test_a_pinned_block_count_is_the_cache_as_the_engine_takes_it():
    rc, fleet, router, _ = _sim([*SMALL, *MIXED, "cache.num_blocks=3000"])
    outcome = run_disagg_once(rc, fleet, router, progress=False)
    assert outcome.pool_blocks == {"prefill": [3000, 3000], "decode": [3000]}


def test_an_autoscaled_pool_plans_staging_for_the_most_peers_it_may_face():
    """A replica's memory is planned once, as it starts: the prefill replica stages for the 3 decode
    replicas its peer pool may grow to."""
    overrides = [*SMALL, "fleet.decode.autoscale={policy: queue, min_replicas: 1, max_replicas: 3}"]
    rc, fleet, router, pools = _sim(overrides)
    outcome, _, _ = run_disagg_autoscaled(rc, fleet, router, pool_autoscale(fleet, AutoscaleConfig(), SLO()), SLO(),
                                          progress=False)
    prefill, decode = _engine_staging([*SMALL, "fleet.decode_replicas=3"], (1, 3))
    assert prefill == 3 * decode > 0
    assert outcome.pool_blocks["prefill"] == [_unstaged(pools[0]) - prefill]
    assert set(outcome.pool_blocks["decode"]) == {_unstaged(pools[1]) - decode}


@pytest.mark.parametrize("staging", [-1, 1.5, True])
def test_bad_staging_is_refused(staging):
    rc, _, _, pools = _sim(SMALL)
    with pytest.raises(ValueError, match="staging_blocks must be an int >= 0"):
        plan_num_blocks(pools[0].model, pools[0].hardware, 16, staging_blocks=staging)
