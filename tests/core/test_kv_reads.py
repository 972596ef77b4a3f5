"""A step's repeated KV reads (engine.core.kv_reads): what the scheduler puts in StepStats is the
brute-force count over the step's block tables, under both policies, plain and overlapped steps,
prefix sharing, chunked prefill and preemption."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import BlockManager, Request, SamplingParams, ScheduledRequest, SchedulerConfig, make_scheduler
from engine.core.kv_reads import read_blocks, repeated_block_reads, step_repeated_reads
from engine.core.loop import SimulatedClock, run
from tests.core.fakes import FakeExecutor, OverlappingFakeExecutor

PREFIXES = ([7] * 24, list(range(100, 140)), [7] * 12 + [8] * 12)


def brute_force(plan, block_size: int) -> tuple[int, int, int]:
    """(blocks read, distinct blocks read, distinct blocks the decodes read) of a plan."""
    read = [read_blocks(e, block_size) for e in plan.scheduled]
    decode_reads = [b for e, blocks in zip(plan.scheduled, read) if e.is_decode for b in blocks]
    return sum(map(len, read)), len(set().union(*read)), len(set(decode_reads))


class CheckingMixin:
    """Checks each plan against the brute-force count when the backend receives it (the tables
    are live: later steps change them)."""

    checked = 0
    shared_steps = 0

    def _compute(self, plan):
        bs = self._info.block_size
        total, distinct, decode_distinct = brute_force(plan, bs)
        decode_total = sum(len(read_blocks(e, bs)) for e in plan.scheduled if e.is_decode)
        assert distinct <= total
        assert plan.stats.repeated_kv_tokens == (total - distinct) * bs
        assert plan.stats.decode_repeated_kv_tokens == (decode_total - decode_distinct) * bs
        assert plan.stats.decode_repeated_kv_tokens <= plan.stats.repeated_kv_tokens
        self.checked += 1
        self.shared_steps += total > distinct
        return super()._compute(plan)


class CheckingExecutor(CheckingMixin, FakeExecutor):
    pass


class CheckingOverlappingExecutor(CheckingMixin, OverlappingFakeExecutor):
    pass


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    specs = []
    for _ in range(draw(st.integers(1, 12))):
        prefix = draw(st.sampled_from(PREFIXES))[: draw(st.integers(0, 40))]
        suffix = draw(st.lists(st.integers(0, 30), min_size=0 if prefix else 1, max_size=20))
        specs.append((prefix + suffix, draw(st.integers(1, 30))))
    need = max(-(-(len(p) + m - 1) // block_size) for p, m in specs)
    num_blocks = draw(st.integers(need, need * 3))
    max_num_seqs = draw(st.integers(1, 8))
    chunked = draw(st.booleans())
    config = SchedulerConfig(policy=draw(st.sampled_from(["nano", "mixed"])), max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=draw(st.integers(max_num_seqs, 96)) if chunked else 128,
                             max_model_len=128, enable_chunked_prefill=chunked)
    arrivals = sorted(draw(st.lists(st.integers(0, 20), min_size=len(specs), max_size=len(specs))))
    return config, block_size, num_blocks, specs, arrivals, draw(st.booleans())


def _serve(config, block_size, num_blocks, specs, arrivals, overlapped):
    executor = (CheckingOverlappingExecutor if overlapped else CheckingExecutor)(num_blocks, block_size)
    scheduler = make_scheduler(config, executor.info())
    requests = [Request(f"q{i}", p, SamplingParams(max_tokens=m, ignore_eos=True), arrival_time=t * 1e-3)
                for i, ((p, m), t) in enumerate(zip(specs, arrivals))]
    run(scheduler, executor, requests, SimulatedClock())
    return scheduler, executor


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_stats_count_the_repeated_reads_of_the_step_tables(case):
    scheduler, executor = _serve(*case)
    assert executor.checked > 0
    bm = scheduler.block_manager
    assert bm.num_extra_refs == 0 and bm.num_holders == 0  # everything was released


def test_a_shared_prefix_workload_has_steps_with_repeated_reads():
    rng = random.Random(0)
    specs = [(PREFIXES[i % 2] + [rng.randrange(50) for _ in range(5)], 12) for i in range(8)]
    for policy in ("nano", "mixed"):
        config = SchedulerConfig(policy=policy, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128)
        # one request first, so that the others find its prefix in the cache
        _, executor = _serve(config, 4, 200, specs, [0] + [5] * 7, False)
        assert executor.shared_steps > 5
        decode = [p for p in executor.plans if p.stats.kind == "decode"]
        assert max(p.stats.decode_repeated_kv_tokens for p in decode) > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=6), max_size=6))
def test_repeated_reads_are_zero_exactly_when_no_block_is_read_twice(tables):
    repeated = repeated_block_reads(tables)
    assert repeated >= 0
    reads = [b for t in tables for b in t]
    assert (repeated == 0) == (len(reads) == len(set(reads)))
    assert repeated == len(reads) - len(set(reads))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12), st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_any_subset_of_the_holders_is_counted_from_its_own_tables(specs):
    """Holders share prefixes through cache hits; the step is any subset of them, decodes and
    prefills mixed (the policies never leave out a holder in a mixed step; another policy may)."""
    bs = 4
    bm = BlockManager(200, bs)
    origins = {}
    entries = []
    for i, (group, tail, is_decode, in_step) in enumerate(specs):
        request = Request(f"r{i}", [group] * 12 + [50 + i] * tail, SamplingParams())
        hits = bm.lookup(request) if group in origins else []
        bm.allocate(request, request.num_tokens, hits)
        request.num_computed_tokens = request.num_tokens
        bm.register_computed(request)
        origins.setdefault(group, request)
        if in_step:
            new = 1 if is_decode else min(3, request.num_tokens)
            entries.append(ScheduledRequest(request.request_id, [0] * new, request.num_tokens - new,
                                            request.block_table, True, SamplingParams(), 0, is_decode))
    decodes = sum(e.is_decode for e in entries)
    repeated, decode_repeated = step_repeated_reads(entries, bm, decodes)
    assert step_repeated_reads(entries, bm) == (repeated, decode_repeated)  # decodes counted there
    assert repeated == repeated_block_reads(read_blocks(e, bs) for e in entries)
    assert decode_repeated == repeated_block_reads(read_blocks(e, bs) for e in entries if e.is_decode)
