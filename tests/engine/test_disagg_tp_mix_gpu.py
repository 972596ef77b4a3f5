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


@pytest.mark.parametrize("prefill_tp, decode_tp", [(1, 2), (2, 1)])
def test_pools_of_two_tp_sizes_move_kv_over_nccl_and_tokens_match_the_aggregated_engine(tiny_qwen3_dir, prefill_tp,
                                                                                        decode_tp):
    from engine.config import EngineConfig
    from engine.core.config import ExecutionConfig
    from tests.engine.test_disagg_engine import _requests, aggregated_tokens, serve_disagg

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cuda", dtype="float32")
    configs = [replace(config, execution=ExecutionConfig(tensor_parallel_size=tp)) for tp in (prefill_tp, decode_tp)]
    result = serve_disagg(configs, _requests())
    served = {r.request_id: r.output_token_ids for r in result.requests}
    assert served == aggregated_tokens(tiny_qwen3_dir, _requests(), 1, "cuda") == \
        aggregated_tokens(tiny_qwen3_dir, _requests(), 2, "cuda")
    moved = [t for t in result.transfers.values() if t.decode >= 0]
    assert len(moved) == 7 and all(t.transfer_s > 0 for t in moved)
