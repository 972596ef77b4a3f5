"""The worked examples of ../shared/reference, replayed step by step on our core."""

from __future__ import annotations

from engine.core import Request, SamplingParams, SchedulerConfig, StepResult, make_scheduler
from tests.core.fakes import backend_info


def _step(scheduler, token=1):
    plan = scheduler.schedule()
    scheduler.update(plan, StepResult([token] * len(plan.scheduled), 0.0))
    return plan


def test_ten_sequence_walkthrough():
    # 7 blocks of 16 tokens, prompts of 8 tokens: a sequence lives in one block, so seven fit.
    config = SchedulerConfig(policy="nano", max_num_seqs=7, max_num_batched_tokens=512, max_model_len=64)
    scheduler = make_scheduler(config, backend_info(num_blocks=7, block_size=16))
    for i in range(1, 11):
        max_tokens = 5 if i in (1, 4) else 9
        scheduler.add(Request(f"seq{i}", [i] * 8, SamplingParams(max_tokens=max_tokens, ignore_eos=True)))

    # iteration 1: seq1..seq7 prefilled in one step (max batch of 7)
    plan = _step(scheduler)
    assert plan.stats.kind == "prefill"
    assert [e.request_id for e in plan.scheduled] == [f"seq{i}" for i in range(1, 8)]
    assert [r.request_id for r in scheduler.waiting] == ["seq8", "seq9", "seq10"]

    # iterations 2-5: seq8 cannot be admitted (no free block), the seven decode
    for _ in range(4):
        plan = _step(scheduler)
        assert plan.stats.kind == "decode" and plan.stats.num_requests == 7
    # seq1 and seq4 finished after iteration 5 and freed their blocks
    assert [r.request_id for r in scheduler.running] == ["seq2", "seq3", "seq5", "seq6", "seq7"]
    assert scheduler.block_manager.num_free_blocks == 2

    # iteration 6: seq8 and seq9 take the freed blocks; seq10 still does not fit
    plan = _step(scheduler)
    assert plan.stats.kind == "prefill"
    assert [e.request_id for e in plan.scheduled] == ["seq8", "seq9"]
    assert [r.request_id for r in scheduler.waiting] == ["seq10"]

    # iteration 7: all seven running sequences decode in one step
    plan = _step(scheduler)
    assert plan.stats.kind == "decode"
    assert [e.request_id for e in plan.scheduled] == ["seq2", "seq3", "seq5", "seq6", "seq7", "seq8", "seq9"]
    outputs = {r.request_id: r.num_output_tokens for r in scheduler.running}
    assert outputs["seq2"] == 6 and outputs["seq8"] == 2


def test_two_sequence_prefix_cache_batch():
    # Block size 1 so a hit can end at any token: seq1 finds 16 cached tokens, seq2 finds 5.
    config = SchedulerConfig(policy="nano", max_num_seqs=4, max_num_batched_tokens=256, max_model_len=64)
    scheduler = make_scheduler(config, backend_info(num_blocks=200, block_size=1))
    seq1 = list(range(100, 135))  # 35 tokens
    seq2 = list(range(200, 220))  # 20 tokens
    greedy_one = SamplingParams(max_tokens=1, ignore_eos=True)
    scheduler.add(Request("warm1", seq1[:16] + [0], greedy_one))
    scheduler.add(Request("warm2", seq2[:5] + [0], greedy_one))
    _step(scheduler)
    assert not scheduler.has_unfinished()

    scheduler.add(Request("seq1", seq1, greedy_one))
    scheduler.add(Request("seq2", seq2, greedy_one))
    plan = scheduler.schedule()
    cached = [e.num_computed_tokens for e in plan.scheduled]
    new = [e.num_new_tokens for e in plan.scheduled]
    assert cached == [16, 5] and new == [19, 15]
    assert plan.stats.prefix_hit_tokens == 21
    # the varlen layout an attention kernel receives
    cu_q, cu_k = [0], [0]
    for entry in plan.scheduled:
        cu_q.append(cu_q[-1] + entry.num_new_tokens)
        cu_k.append(cu_k[-1] + entry.context_len)
    assert cu_q == [0, 19, 34] and cu_k == [0, 35, 55]
    assert plan.scheduled[0].token_ids == seq1[16:]
