"""A disaggregated engine fleet on CPU: a tiny-model prefill replica and a decode replica, each a
process, the KV moved between them over gloo (engine.kv_link). Greedy outputs equal a single
engine's exactly (float32); a request its first token ends moves nothing; transfers are timed."""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.core import CacheConfig, Request, SamplingParams, SchedulerConfig
from engine.core.disagg_wall import run_disagg_wall
from engine.core.loop import WallClock
from engine.core.routers import RouterConfig, make_router

pytest.importorskip("torch")

SCHEDULER = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
CACHE = CacheConfig(block_size=16, num_blocks=64)


def _requests(n=8):
    rng = random.Random(1)
    out = [Request(f"r{i}", [rng.randrange(1, 500) for _ in range(rng.randrange(4, 90))],
                   SamplingParams(temperature=0.0, max_tokens=rng.randrange(2, 20), ignore_eos=True),
                   arrival_time=0.01 * i) for i in range(n)]
    out[2] = Request("r2", out[2].prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
                     arrival_time=0.02)
    return out


def serve_1p1d(config: EngineConfig, requests: list[Request], scheduler: SchedulerConfig = SCHEDULER,
               cache: CacheConfig = CACHE):
    """One prefill and one decode replica of config, each a process, serve requests on the wall
    clock, both pools routed round robin; the fleet's DisaggResult."""
    from engine.replicas import EngineReplicas

    with EngineReplicas([config, config], scheduler, cache, num_prefill=1) as engines:
        clock = WallClock()
        engines.start_run(clock)
        routers = [make_router(RouterConfig("round_robin"), cache.block_size) for _ in range(2)]
        return run_disagg_wall(engines, 1, requests, *routers, clock, scheduler.max_model_len)


def test_prefill_and_decode_replicas_give_the_single_engines_greedy_tokens(tiny_qwen3_dir):
    from engine import LLM

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cpu", dtype="float32")
    result = serve_1p1d(config, _requests())
    llm = LLM(tiny_qwen3_dir, device="cpu", dtype="float32", max_model_len=SCHEDULER.max_model_len)
    try:
        reference = _requests()
        outputs = llm.generate([r.prompt_token_ids for r in reference], [r.sampling_params for r in reference],
                               use_tqdm=False)
    finally:
        llm.executor.shutdown()
    served = {r.request_id: r.output_token_ids for r in result.requests}
    assert served == {f"r{i}": out.token_ids for i, out in enumerate(outputs)}
    assert not result.rejected
    # the max_tokens=1 request ended on the prefill replica: no transfer
    assert result.transfers["r2"].decode == -1
    moved = [t for rid, t in result.transfers.items() if rid != "r2"]
    assert all(t.decode == 0 and t.transfer_s > 0 and t.bytes > 0 for t in moved)
    # tiny-qwen3's KV per block: layers x (K, V) x block_size x kv_heads x head_dim x 4 bytes
    decoded = {r.request_id: r for r in result.requests}
    for rid, t in result.transfers.items():
        if t.decode >= 0:
            blocks = -(-decoded[rid].num_prompt_tokens // CACHE.block_size)
            assert t.bytes % blocks == 0
    assert result.decode[0].steps and result.prefill[0].steps


@pytest.mark.slow
def test_tp2_pools_move_each_ranks_kv_shard_and_give_the_tp2_engines_tokens(tiny_qwen3_dir):
    """Prefill and decode replicas of TP 2 each (4 processes on gloo): each TP rank sends its KV
    shard to the same rank of the decode replica; greedy tokens equal a TP 2 engine's (the same
    shards summed in the same order), which they could not were a worker's shard missing."""
    from dataclasses import replace

    from engine.core.config import ExecutionConfig

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cpu", dtype="float32")
    config = replace(config, execution=ExecutionConfig(tensor_parallel_size=2))
    result = serve_1p1d(config, _requests(6))
    assert {r.request_id: r.output_token_ids for r in result.requests} == \
        aggregated_tokens(tiny_qwen3_dir, _requests(6), 2)
    assert sum(t.decode == 0 for t in result.transfers.values()) == 5


def serve_disagg(configs, requests):
    """requests served by a 1P1D engine fleet of these two replica configs (prefill first)."""
    from engine.replicas import EngineReplicas

    with EngineReplicas(configs, SCHEDULER, CACHE, num_prefill=1) as engines:
        clock = WallClock()
        engines.start_run(clock)
        routers = [make_router(RouterConfig("round_robin"), CACHE.block_size) for _ in range(2)]
        return run_disagg_wall(engines, 1, requests, *routers, clock, SCHEDULER.max_model_len)


def aggregated_tokens(model_dir, requests, tp: int, device: str = "cpu") -> dict[str, list[int]]:
    """Each request's greedy float32 tokens from one aggregated engine of TP size tp."""
    from engine import LLM

    llm = LLM(model_dir, device=device, dtype="float32", max_model_len=SCHEDULER.max_model_len,
              tensor_parallel_size=tp)
    try:
        outputs = llm.generate([r.prompt_token_ids for r in requests], [r.sampling_params for r in requests],
                               use_tqdm=False)
    finally:
        llm.shutdown()
    return {r.request_id: out.token_ids for r, out in zip(requests, outputs)}


@pytest.mark.slow
@pytest.mark.parametrize("prefill_tp, decode_tp", [(1, 2), (2, 1)])
def test_pools_of_two_tp_sizes_regroup_kv_heads_and_give_the_aggregated_engines_tokens(tiny_qwen3_dir, prefill_tp,
                                                                                      decode_tp):
    """A TP 1 replica and a TP 2 replica (3 processes on gloo): tiny-qwen3's two KV heads are split
    over the decode ranks, or joined from the prefill ranks (engine.core.kv_heads). Greedy
    float32 tokens equal the aggregated engine's at either TP size, which they could not were a
    head missing, misplaced or taken from the wrong rank."""
    from dataclasses import replace

    from engine.core.config import ExecutionConfig

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cpu", dtype="float32")
    configs = [replace(config, execution=ExecutionConfig(tensor_parallel_size=tp)) for tp in (prefill_tp, decode_tp)]
    result = serve_disagg(configs, _requests(6))
    served = {r.request_id: r.output_token_ids for r in result.requests}
    assert served == aggregated_tokens(tiny_qwen3_dir, _requests(6), 1) == \
        aggregated_tokens(tiny_qwen3_dir, _requests(6), 2)
    moved = [t for t in result.transfers.values() if t.decode == 0]
    assert len(moved) == 5 and all(t.transfer_s > 0 for t in moved)
    # the whole request's KV (both heads) is reported, whichever ranks sent it
    decoded = {r.request_id: r for r in result.requests}
    per_block = 2 * 2 * CACHE.block_size * 2 * 16 * 4  # layers x K/V x block x kv heads x head_dim x 4 bytes
    for rid, t in result.transfers.items():
        if t.decode == 0:
            assert t.bytes == -(-decoded[rid].num_prompt_tokens // CACHE.block_size) * per_block


@pytest.mark.slow
def test_two_prefill_replicas_into_one_decode_staging_ring_each_give_the_single_engines_tokens(tiny_qwen3_dir):
    """2P1D with prompts of 13 of max_model_len's 16 blocks: the decode replica's staging ring per
    prefill peer (engine.core.kv_staging: two full-length requests) holds two of them at a time
    while its cache has room for all six, so receives wait for staging and land through reused
    ring space; the tokens still equal a single engine's."""
    from engine import LLM
    from engine.replicas import EngineReplicas

    rng = random.Random(2)
    requests = [Request(f"r{i}", [rng.randrange(1, 500) for _ in range(200)],
                        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)) for i in range(6)]
    config = EngineConfig(model=str(tiny_qwen3_dir), device="cpu", dtype="float32")
    cache = CacheConfig(block_size=16, num_blocks=160)
    with EngineReplicas([config] * 3, SCHEDULER, cache, num_prefill=2) as engines:
        clock = WallClock()
        engines.start_run(clock)
        routers = [make_router(RouterConfig("round_robin"), cache.block_size) for _ in range(2)]
        result = run_disagg_wall(engines, 2, requests, *routers, clock, SCHEDULER.max_model_len)
    llm = LLM(tiny_qwen3_dir, device="cpu", dtype="float32", max_model_len=SCHEDULER.max_model_len)
    try:
        outputs = llm.generate([r.prompt_token_ids for r in requests], [r.sampling_params for r in requests],
                               use_tqdm=False)
    finally:
        llm.executor.shutdown()
    assert {r.request_id: r.output_token_ids for r in result.requests} == {
        f"r{i}": out.token_ids for i, out in enumerate(outputs)}
    assert {t.prefill for t in result.transfers.values()} == {0, 1}
