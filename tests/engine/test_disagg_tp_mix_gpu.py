"""The disaggregated engine fleet with pools of two TP sizes on GPUs: a TP 1 replica and a TP 2
replica (3 GPUs), the KV heads regrouped over NCCL (engine.core.kv_heads); greedy float32 tokens
equal the aggregated engine's at either TP size. Needs 3 CUDA devices; skipped otherwise. The
link alone, with replicated heads too, is tests/engine/test_kv_reshard.py's NCCL test."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 3,
                                                  reason="needs 3 CUDA devices")]


def _aggregated(model_dir, requests, tp: int) -> dict[str, list[int]]:
    from engine import LLM
    from tests.engine.test_disagg_engine import SCHEDULER

    llm = LLM(model_dir, device="cuda", dtype="float32", max_model_len=SCHEDULER.max_model_len,
              tensor_parallel_size=tp)
    try:
        outputs = llm.generate([r.prompt_token_ids for r in requests], [r.sampling_params for r in requests],
                               use_tqdm=False)
    finally:
        llm.shutdown()
    return {r.request_id: out.token_ids for r, out in zip(requests, outputs)}


@pytest.mark.parametrize("prefill_tp, decode_tp", [(1, 2), (2, 1)])
def test_pools_of_two_tp_sizes_move_kv_over_nccl_and_tokens_match_the_aggregated_engine(tiny_qwen3_dir, prefill_tp,
                                                                                        decode_tp):
    from engine.config import EngineConfig
    from engine.core.config import ExecutionConfig
    from engine.core.disagg_wall import run_disagg_wall
    from engine.core.loop import WallClock
    from engine.core.routers import RouterConfig, make_router
    from engine.replicas import EngineReplicas
    from tests.engine.test_disagg_engine import CACHE, SCHEDULER, _requests

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cuda", dtype="float32")
    configs = [replace(config, execution=ExecutionConfig(tensor_parallel_size=tp)) for tp in (prefill_tp, decode_tp)]
    with EngineReplicas(configs, SCHEDULER, CACHE, num_prefill=1) as engines:
        clock = WallClock()
        engines.start_run(clock)
        routers = [make_router(RouterConfig("round_robin"), CACHE.block_size) for _ in range(2)]
        result = run_disagg_wall(engines, 1, _requests(), *routers, clock, SCHEDULER.max_model_len)
    served = {r.request_id: r.output_token_ids for r in result.requests}
    assert served == _aggregated(tiny_qwen3_dir, _requests(), 1) == _aggregated(tiny_qwen3_dir, _requests(), 2)
    moved = [t for t in result.transfers.values() if t.decode >= 0]
    assert len(moved) == 7 and all(t.transfer_s > 0 for t in moved)
