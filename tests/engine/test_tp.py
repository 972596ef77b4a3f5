"""Tensor parallelism with real worker processes: gloo on CPU here, NCCL on GPUs in test_tp_gpu.

A TP engine must produce exactly the single-process engine's tokens (float32 on CPU: the sums
over ranks differ from the single matmul only by rounding far below any sampling margin), and
leave no process behind. With async scheduling (the CPU runs it when asked; CUDA by default)
every rank fills step N+1's placeholders from step N's ids (drawn from its vocabulary slice,
or broadcast by rank 0 where a top-p row made the ranks gather the logits), so the
tokens and, with ignore_eos, the schedule must be those of a TP=1 engine running steps one at a
time.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch.distributed as dist

from engine import LLM, SamplingParams

PROMPTS = [[5, 17, 300, 42, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [400, 3], list(range(100, 140))]


def _engine(model_dir, tp, **kw):
    return LLM(str(model_dir), device="cpu", max_model_len=96, block_size=4, max_num_batched_tokens=32,
               tensor_parallel_size=tp, **kw)


def _generate(model_dir, tp, params, plans=None, on_start=None, **kw):
    """Tokens of each prompt; plans (a list) collects each step's decisions in step order;
    on_start(llm) runs before generating."""
    llm = _engine(model_dir, tp, **kw)
    if on_start is not None:
        on_start(llm)
    if plans is not None:
        llm.executor.observe(lambda plan, result, timing: plans.append(_decisions(plan)))
    try:
        assert llm.executor.info().overlaps_steps is bool(kw.get("async_scheduling"))
        # "auto" (the default) on CPU ranks: no symmetric memory, so the ranks sum on the ring
        assert llm.executor.info().all_reduce == ("nccl" if tp > 1 else "")
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        workers = llm.executor.workers
        procs = list(workers.procs) if workers else []
        assert len(procs) == tp - 1 and all(p.is_alive() for p in procs)
    finally:
        llm.shutdown()
    assert not any(p.is_alive() for p in procs), "workers outlived shutdown()"
    assert not dist.is_initialized()
    return [o.token_ids for o in outs]


def _decisions(plan):
    return ([(e.request_id, e.num_computed_tokens, len(e.token_ids), e.sample) for e in plan.scheduled],
            tuple(plan.preempted_ids))


@pytest.fixture
def spawned():
    """The child processes started since the test began: the engine must leave none behind (other
    tests' pools, such as joblib's workers, may still be alive in the same process)."""
    before = {child.pid for child in mp.active_children()}
    return lambda: [child for child in mp.active_children() if child.pid not in before]


def _params():
    # greedy, and seeded sampling, which reacts to any logit change larger than rounding
    return [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
            SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=7),
            SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, ignore_eos=True, seed=3),
            SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)]


def test_tp2_matches_single_process(tiny_qwen3_dir, spawned):
    want = _generate(tiny_qwen3_dir, 1, _params())
    assert _generate(tiny_qwen3_dir, 2, _params()) == want
    assert not spawned()


@pytest.mark.slow
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tp4_replicated_kv_heads_matches_single_process(tiny_qwen3_dir, async_scheduling):
    # 4 ranks over 2 kv heads: each kv head lives on two ranks; overlapped, three workers take
    # each step's batch and the broadcast ids
    assert _generate(tiny_qwen3_dir, 4, _params(), async_scheduling=async_scheduling) == \
        _generate(tiny_qwen3_dir, 1, _params())


def test_tp2_async_matches_tp1_sync_tokens_and_schedule(tiny_qwen3_dir, spawned):
    # 16 blocks of 4 tokens hold the longest request (40 + 10 tokens) but not all four at once:
    # requests are preempted and recomputed, and the placeholders must follow them
    kw = dict(num_blocks=16)
    plans_sync, plans_async = [], []
    want = _generate(tiny_qwen3_dir, 1, _params(), plans_sync, async_scheduling=False, **kw)
    got = _generate(tiny_qwen3_dir, 2, _params(), plans_async, async_scheduling=True, **kw)
    assert got == want
    assert plans_async == plans_sync  # ignore_eos: the overlapped schedule is the plain one
    assert any(preempted for _, preempted in plans_sync)
    assert not spawned()


# the synchronous loop's variant in the slow suite: test_tp2_matches_single_process runs that loop
@pytest.mark.parametrize("async_scheduling", [pytest.param(False, marks=pytest.mark.slow), True])
def test_tp2_samples_from_vocabulary_slices_and_matches_tp1(tiny_qwen3_dir, async_scheduling, spawned):
    # no top-k or top-p: every rank draws from its slice of the vocabulary and no logits are
    # gathered (engine.sharded_sampling); the engine's own stream (the unseeded row) included
    params = [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=7),
              SamplingParams(temperature=0.9, max_tokens=10, ignore_eos=True),
              SamplingParams(temperature=1.3, max_tokens=10, ignore_eos=True, seed=2)]
    calls = {"by_slice": 0, "gathered": 0}

    def counted(name, call):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return call(*args, **kwargs)
        return wrapper

    def count(llm):
        runner = llm.executor.runner
        runner.sharded_sampler.sample = counted("by_slice", runner.sharded_sampler.sample)
        runner.model.compute_logits = counted("gathered", runner.model.compute_logits)

    want = _generate(tiny_qwen3_dir, 1, params)
    assert _generate(tiny_qwen3_dir, 2, params, on_start=count, async_scheduling=async_scheduling) == want
    assert calls["by_slice"] >= 10 and calls["gathered"] == 0
    assert not spawned()


def test_tp2_async_rank0_reads_nothing_from_the_workers_per_step(tiny_qwen3_dir, spawned):
    llm = _engine(tiny_qwen3_dir, 2, async_scheduling=True)
    workers = llm.executor.workers
    sent, reads = [], []
    send_bytes = workers.conns[0].send_bytes
    workers.conns[0].send_bytes = lambda data: (sent.append(data), send_bytes(data))
    receive = workers._receive
    workers._receive = lambda *a: (reads.append(a), receive(*a))[1]
    try:
        llm.generate(PROMPTS, _params(), use_tqdm=False)
    finally:
        llm.shutdown()
    kinds = [pickle.loads(data)[0] for data in sent]
    assert kinds and set(kinds) == {"submit"} and len(kinds) == len(llm.last_run.steps)
    assert reads == []
    assert not spawned() and not dist.is_initialized()


@pytest.mark.slow  # two whole TP engines; the default suite shuts one down cleanly (test_tp2_matches_single_process)
def test_a_second_engine_starts_after_shutdown(tiny_qwen2_dir):
    first = _generate(tiny_qwen2_dir, 2, _params())
    assert _generate(tiny_qwen2_dir, 2, _params()) == first


def test_unsplittable_model_is_rejected_before_spawning(tiny_qwen3_dir, spawned):
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=3)
    assert not spawned()


def test_symmetric_all_reduce_on_cpu_is_rejected_before_spawning(tiny_qwen3_dir, spawned):
    with pytest.raises(ValueError, match="all_reduce='symmetric' needs CUDA"):
        LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=2, all_reduce="symmetric")
    assert not spawned() and not dist.is_initialized()


# the overlapped loop's variant in the slow suite: test_a_worker_dying_mid_run_fails_the_run_and_shuts_down
# runs that loop
@pytest.mark.parametrize("async_scheduling", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_dead_worker_fails_the_next_step(tiny_qwen3_dir, async_scheduling, spawned):
    from engine.tp.workers import WorkerError

    llm = _engine(tiny_qwen3_dir, 2, async_scheduling=async_scheduling)
    try:
        proc = llm.executor.workers.procs[0]
        proc.kill()
        proc.join()
        with pytest.raises(WorkerError, match="rank 1 exited"):
            llm.generate(PROMPTS, _params(), use_tqdm=False)
    finally:
        llm.shutdown()
    assert not spawned() and not dist.is_initialized()


def test_a_worker_dying_mid_run_fails_the_run_and_shuts_down(tiny_qwen3_dir, spawned):
    from engine.tp.workers import WorkerError

    llm = _engine(tiny_qwen3_dir, 2, async_scheduling=True)
    proc = llm.executor.workers.procs[0]
    steps = []

    def kill_after_three(plan, result, timing):  # step 3's result is read after step 4 was queued
        steps.append(plan.stats.step)
        if len(steps) == 3:
            proc.kill()
            proc.join()

    llm.executor.observe(kill_after_three)
    try:
        with pytest.raises(WorkerError, match="rank 1 exited"):
            llm.generate(PROMPTS, _params(), use_tqdm=False)
    finally:
        llm.shutdown()
    assert len(steps) == 3 and not llm.scheduler.has_unfinished()
    assert not spawned() and not dist.is_initialized()
