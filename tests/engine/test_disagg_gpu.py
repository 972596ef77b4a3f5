"""The disaggregated engine fleet on two GPUs: the KV moves over NCCL, greedy tokens equal a
single engine's in float32. Needs 2 CUDA devices; skipped otherwise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                                  reason="needs 2 CUDA devices")]


def test_nccl_moves_kv_and_tokens_match_the_single_engine(tiny_qwen3_dir):
    from engine import LLM
    from engine.config import EngineConfig
    from engine.core.disagg_wall import run_disagg_wall
    from engine.core.loop import WallClock
    from engine.core.routers import RouterConfig, make_router
    from engine.replicas import EngineReplicas
    from tests.engine.test_disagg_engine import CACHE, SCHEDULER, _requests

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cuda", dtype="float32")
    with EngineReplicas([config, config], SCHEDULER, CACHE, num_prefill=1) as engines:
        clock = WallClock()
        engines.start_run(clock)
        routers = [make_router(RouterConfig("round_robin"), CACHE.block_size) for _ in range(2)]
        result = run_disagg_wall(engines, 1, _requests(), *routers, clock, SCHEDULER.max_model_len)
    llm = LLM(tiny_qwen3_dir, device="cuda", dtype="float32", max_model_len=SCHEDULER.max_model_len)
    try:
        reference = _requests()
        outputs = llm.generate([r.prompt_token_ids for r in reference], [r.sampling_params for r in reference],
                               use_tqdm=False)
    finally:
        llm.executor.shutdown()
    assert {r.request_id: r.output_token_ids for r in result.requests} == {
        f"r{i}": out.token_ids for i, out in enumerate(outputs)}
    assert all(t.transfer_s > 0 for t in result.transfers.values() if t.decode >= 0)
