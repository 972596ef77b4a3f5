"""Bad input is refused at admission with a message that names the problem; nobody else is hurt."""

from __future__ import annotations

import pytest

from engine.core import (
    CacheConfig,
    FinishReason,
    Request,
    RequestStatus,
    SamplingParams,
    SchedulerConfig,
    StepResult,
    make_scheduler,
)
from engine.core.loop import SimulatedClock, run
from tests.core.fakes import FakeExecutor, backend_info


def _scheduler(num_blocks=8, block_size=4, **kw):
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, **kw)
    return make_scheduler(config, backend_info(num_blocks, block_size))


@pytest.mark.parametrize(
    "prompt, max_tokens, message",
    [
        ([], 4, "empty prompt"),
        ([1] * 30, 4, "exceeds max_model_len=32"),
        ([1] * 32, None, "leaves no room"),
        ([1] * 20, 12, "needs 8 KV blocks"),  # 31 stored tokens = 8 blocks of 4 > 6 blocks
    ],
)
def test_bad_requests_are_refused_and_state_is_untouched(prompt, max_tokens, message):
    scheduler = _scheduler(num_blocks=6)
    scheduler.add(Request("good", [1, 2, 3], SamplingParams(max_tokens=2)))
    with pytest.raises(ValueError, match=message):
        scheduler.add(Request("bad", prompt, SamplingParams(max_tokens=max_tokens)))
    assert [r.request_id for r in scheduler.waiting] == ["good"]
    assert scheduler.block_manager.num_free_blocks == 6


def test_duplicate_id_refused_while_unfinished_and_allowed_after():
    scheduler = _scheduler()
    scheduler.add(Request("a", [1, 2], SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        scheduler.add(Request("a", [3], SamplingParams(max_tokens=1)))
    plan = scheduler.schedule()
    scheduler.update(plan, StepResult([7], 0.0))
    assert not scheduler.has_unfinished()
    scheduler.add(Request("a", [3], SamplingParams(max_tokens=1)))


def test_loop_serves_others_when_one_request_is_bad():
    executor = FakeExecutor(num_blocks=8, block_size=4)
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32)
    scheduler = make_scheduler(config, executor.info())
    requests = [
        Request("ok1", [1, 2, 3], SamplingParams(max_tokens=3)),
        Request("too-long", [1] * 40, SamplingParams(max_tokens=3)),
        Request("ok2", [4, 5], SamplingParams(max_tokens=2)),
    ]
    result = run(scheduler, executor, requests, SimulatedClock())
    assert [r.request_id for r in result.requests] == ["ok1", "ok2"]
    assert "max_model_len" in result.rejected["too-long"]
    assert [r.num_output_tokens for r in result.requests] == [3, 2]


@pytest.mark.parametrize("policy", ["nano", "mixed"])
def test_abort_frees_blocks_of_waiting_and_running(policy):
    scheduler = _scheduler(policy=policy)
    scheduler.add(Request("run", [1] * 9, SamplingParams(max_tokens=5)))
    plan = scheduler.schedule()
    scheduler.update(plan, StepResult([1], 0.0))
    scheduler.add(Request("wait", [2] * 5, SamplingParams(max_tokens=5)))
    assert scheduler.block_manager.num_free_blocks == 8 - 3
    assert scheduler.abort("run", now=1.5)
    assert scheduler.abort("wait")
    assert not scheduler.abort("never-seen")
    assert scheduler.block_manager.num_free_blocks == 8
    assert not scheduler.has_unfinished()
    plan = scheduler.schedule()
    assert plan.is_empty and plan.released_ids == ["run", "wait"]


def test_abort_mid_step_drops_the_result():
    scheduler = _scheduler()
    scheduler.add(Request("x", [1, 2, 3], SamplingParams(max_tokens=4)))
    plan = scheduler.schedule()
    scheduler.abort("x")
    assert scheduler.update(plan, StepResult([9], 0.0)) == []


@pytest.mark.parametrize("policy", ["nano", "mixed"])
def test_finish_reasons(policy):
    executor = FakeExecutor(num_blocks=32, block_size=4, vocab_size=10, eos_token_id=3, eos_every=2)
    config = SchedulerConfig(policy=policy, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    scheduler = make_scheduler(config, executor.info(), CacheConfig(block_size=4))
    requests = [
        Request(f"r{i}", [i + 1] * 5, SamplingParams(max_tokens=20, stop_token_ids=(5,))) for i in range(6)
    ] + [Request("ign", [9] * 5, SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=()))]
    result = run(scheduler, executor, requests, SimulatedClock())
    for request in result.requests:
        last = request.output_token_ids[-1]
        assert request.status is RequestStatus.FINISHED
        if request.finish_reason is FinishReason.EOS:
            assert last == 3 and 3 not in request.output_token_ids[:-1]
        elif request.finish_reason is FinishReason.STOP:
            assert last == 5
        else:
            assert request.finish_reason is FinishReason.LENGTH and request.num_output_tokens == 20
    assert result.requests[-1].finish_reason is FinishReason.LENGTH
    reasons = {r.finish_reason for r in result.requests}
    assert FinishReason.EOS in reasons


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"stop_token_ids": (-1,)}, "stop_token_ids"),
        ({"seed": -5}, "seed must be in"),
    ],
)
def test_sampling_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_sampling_params_type_errors():
    with pytest.raises(TypeError, match="max_tokens must be int"):
        SamplingParams(max_tokens=3.5)
    with pytest.raises(TypeError, match="temperature"):
        SamplingParams(temperature="hot")
    with pytest.raises(TypeError, match="stop_token_ids must be a list of token ids, got int"):
        SamplingParams(stop_token_ids=5)


def test_sampling_params_stop_token_ids_none_means_none():
    # vLLM's own default is None; a caller passing it through must not hit a bare iteration error
    assert SamplingParams(stop_token_ids=None).stop_token_ids == ()
    assert SamplingParams(stop_token_ids=[7, 8]).stop_token_ids == (7, 8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": "fifo"}, "policy must be one of"),
        ({"max_num_seqs": 0}, "max_num_seqs must be a positive int"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "max_num_batched_tokens must be >= max_num_seqs"),
        ({"enable_chunked_prefill": False, "max_num_seqs": 8, "max_num_batched_tokens": 100, "max_model_len": 200},
         "chunked prefill"),
    ],
)
def test_scheduler_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"block_size": 0}, "block_size must be a positive int"),
    ({"block_size": True}, "block_size must be a positive int"),
    ({"num_blocks": True}, "num_blocks must be a positive int or None"),
    ({"num_blocks": 0}, "num_blocks must be a positive int or None"),
])
def test_cache_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CacheConfig(**kwargs)


def test_switches_must_be_bools():
    # a string such as "no" is truthy: taken as is it would turn the feature on
    with pytest.raises(TypeError, match="CacheConfig.enable_prefix_caching must be a bool, got 'no'"):
        CacheConfig(enable_prefix_caching="no")
    with pytest.raises(TypeError, match="SchedulerConfig.enable_chunked_prefill must be a bool, got 0"):
        SchedulerConfig(enable_chunked_prefill=0)
