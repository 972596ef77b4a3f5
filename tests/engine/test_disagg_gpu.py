"""The disaggregated engine fleet on two GPUs: the KV moves over NCCL, greedy tokens equal a
single engine's in float32. Needs 2 CUDA devices; skipped otherwise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                                  reason="needs 2 CUDA devices")]


def test_nccl_moves_kv_and_tokens_match_the_single_engine(tiny_qwen3_dir):
    from engine.config import EngineConfig
    from tests.engine.test_disagg_engine import _requests, aggregated_tokens, serve_1p1d

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cuda", dtype="float32")
    result = serve_1p1d(config, _requests())
    assert {r.request_id: r.output_token_ids for r in result.requests} == \
        aggregated_tokens(tiny_qwen3_dir, _requests(), 1, "cuda")
    assert all(t.transfer_s > 0 for t in result.transfers.values() if t.decode >= 0)


def test_bfloat16_disaggregated_tokens_are_the_single_engines_greedy_choices(tmp_path_factory):
    """bf16, teacher-forced: the disaggregated fleet's greedy tokens (prefill on one GPU, decode on
    the other from the moved KV), fed back as a prefix to a single engine, are at every position
    within bf16 rounding of that engine's largest logit. Free-running the two may part at a
    near-tie (other batches, other roundings), so identical outputs are only reported."""
    from engine import LLM
    from engine.checkpoint import write_checkpoint
    from engine.config import EngineConfig
    from engine.core import CacheConfig, Request, SchedulerConfig
    from engine.core.config import ExecutionConfig
    from tests.engine.test_disagg_engine import serve_1p1d
    from tests.engine.test_tp_gpu import ENGINE, GREEDY, NUM_TOKENS, _prompts
    from tests.engine.tp_gpu_checks import TP1_ROUNDING, report, tp1_logits
    from tests.engine.tp_gpu_checks import gaps as logit_gaps

    model_dir = str(write_checkpoint("qwen3-0.6b", tmp_path_factory.mktemp("qwen3-0.6b-bf16"), dtype="bfloat16"))
    prompts = _prompts(16, seed=2)
    scheduler = SchedulerConfig(max_num_seqs=ENGINE["max_num_seqs"],
                                max_num_batched_tokens=ENGINE["max_num_batched_tokens"],
                                max_model_len=ENGINE["max_model_len"])
    cache = CacheConfig(block_size=256)
    config = EngineConfig(model=model_dir, device="cuda",
                          execution=ExecutionConfig(gpu_memory_utilization=ENGINE["gpu_memory_utilization"]))
    requests = [Request(f"r{i}", p, GREEDY, arrival_time=0.0) for i, p in enumerate(prompts)]
    result = serve_1p1d(config, requests, scheduler, cache)
    got = {r.request_id: r.output_token_ids for r in result.requests}
    got = [got[f"r{i}"] for i in range(len(prompts))]
    assert all(len(g) == NUM_TOKENS for g in got) and all(t.transfer_s > 0 for t in result.transfers.values())
    llm = LLM(model_dir, **ENGINE)
    try:
        want = [o.token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
        logits = tp1_logits(llm, [p + g for p, g in zip(prompts, got)], [len(p) for p in prompts])
    finally:
        llm.shutdown()
    gaps = [gap for row, g in zip(logits, got) for gap in logit_gaps(row, g)[0]]
    report("disagg_bfloat16", {"prompts": len(prompts), "tokens_each": NUM_TOKENS, "tolerance_relative": TP1_ROUNDING,
                               "largest_gap_relative": max(gaps), "positions_off_argmax": sum(g > 0 for g in gaps),
                               "free_running_identical": sum(a == b for a, b in zip(want, got))})
    assert max(gaps) <= TP1_ROUNDING, max(gaps)


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 CUDA devices")
def test_tp2_pools_move_each_ranks_shard_over_nccl_and_tokens_match_a_tp2_engine(tiny_qwen3_dir):
    """1P1D of TP 2 each on 4 GPUs: each TP rank sends its KV shard to the same rank of the
    decode replica (engine.kv_link.WorkerShards); greedy float32 tokens equal a TP 2 engine's."""
    from dataclasses import replace

    from engine.config import EngineConfig
    from engine.core.config import ExecutionConfig
    from tests.engine.test_disagg_engine import _requests, aggregated_tokens, serve_1p1d

    config = EngineConfig(model=str(tiny_qwen3_dir), device="cuda", dtype="float32")
    config = replace(config, execution=ExecutionConfig(tensor_parallel_size=2))
    result = serve_1p1d(config, _requests())
    assert {r.request_id: r.output_token_ids for r in result.requests} == \
        aggregated_tokens(tiny_qwen3_dir, _requests(), 2, "cuda")
    assert all(t.transfer_s > 0 for t in result.transfers.values() if t.decode >= 0)
