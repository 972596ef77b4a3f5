"""One path through a step's device work: execute() and submit() (overlapped steps) give the same
tokens, submit() feeds a step's sampled ids into the next step's placeholders, and the
attention backends declare what they can capture."""

from __future__ import annotations

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.plan import PLACEHOLDER, ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams
from engine.rank import build_runner

GREEDY = SamplingParams(temperature=0.0)


def _plan(entries, step=1):
    return StepPlan(entries, StepStats(step, "mixed", len(entries), 0, 0, 0, 0, 0, 0, 0))


@pytest.fixture
def runner(tiny_qwen3_dir):
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=128, max_model_len=64)
    cache = CacheConfig(block_size=4, num_blocks=64)
    config = EngineConfig(model=str(tiny_qwen3_dir), attention_backend="torch")
    runner = build_runner(config, sched, cache, torch.device("cpu"))
    runner.allocate_kv_cache(cache.num_blocks)
    return runner


def _prefill():
    return [ScheduledRequest("a", [5, 6, 7, 8, 9], 0, [0, 1], True, GREEDY, 0, False),
            ScheduledRequest("b", [11, 12, 13], 0, [2], False, GREEDY, 0, False),  # a chunk: no sample
            ScheduledRequest("c", [3, 4], 0, [3], True, SamplingParams(temperature=1.0, seed=9), 0, False)]


def test_submit_and_execute_agree(runner):
    cache = runner.kv_cache.clone()
    executed = runner.execute(_plan(_prefill()))
    runner.kv_cache.copy_(cache)
    submitted = runner.submit(_plan(_prefill(), step=0)).result()
    assert executed[1] == -1 and min(executed[0], executed[2]) >= 0
    assert submitted.token_ids == executed
    assert runner.overlap.last_sampled_rows == {"a": 0, "c": 1}


def test_placeholders_take_the_previous_steps_ids(runner):
    first = runner.submit(_plan(_prefill(), step=0))
    decode = [ScheduledRequest("c", [PLACEHOLDER], 2, [3], True, GREEDY, 1, True),
              ScheduledRequest("a", [PLACEHOLDER], 5, [0, 1], True, GREEDY, 1, True)]
    second = runner.submit(_plan(decode)).result()
    tokens = first.result().token_ids
    cache_after_overlap = runner.kv_cache.clone()
    # the same decode step with the ids written in: same tokens, same cache
    runner.kv_cache.zero_()
    runner.execute(_plan(_prefill()))
    plain = [ScheduledRequest("c", [tokens[2]], 2, [3], True, GREEDY, 1, True),
             ScheduledRequest("a", [tokens[0]], 5, [0, 1], True, GREEDY, 1, True)]
    assert runner.execute(_plan(plain)) == second.token_ids
    torch.testing.assert_close(runner.kv_cache, cache_after_overlap)


def test_a_placeholder_without_a_previous_sample_is_refused(runner):
    runner.submit(_plan(_prefill(), step=0)).result()
    orphan = [ScheduledRequest("b", [PLACEHOLDER], 3, [2], True, GREEDY, 0, True)]  # "b" sampled nothing
    with pytest.raises(RuntimeError, match="'b' has a placeholder input"):
        runner.submit(_plan(orphan))


def test_backends_declare_their_capabilities():
    torch_backend = TorchAttentionBackend()
    assert not torch_backend.supports_decode_graphs() and not torch_backend.supports_prefill_graphs()


def test_triton_backend_captures_both_kinds_of_step():
    pytest.importorskip("triton", reason="the Triton backend needs triton (the gpu extra)")
    from engine.attention.triton_backend import TritonAttentionBackend

    backend = TritonAttentionBackend()
    assert backend.supports_decode_graphs() and backend.supports_prefill_graphs()
