"""The decode kernel's programs in the simulator's price (sim.decode_programs): a step waits on its
longest programs only where they are too few to keep the memory busy, which is where the engine's
rule switches to one program per (sequence, KV head) of the batch's mean context: on 132 SMs with
8 KV heads, from batch 33 on. The profiled model adds that time to decode steps, in step_time and
in the fast-forward's repeats alike; the hardware's figures or backend.decode_programs=false leave
it out."""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.decode_split import fair_share
from harness.scripting import compose_run_config
from kernels.decode_split import balanced_chunk, choose_num_splits, split_chunks
from sim.cost_model import decode_programs, make_cost_model
from sim.decode_programs import DecodePrograms, list_schedule_starts, walk_seconds
from tests.sim.helpers import decode_batch

# Qwen3-0.6B on an H200: 8 KV heads, 28 layers, 512 B of K and V per key and head; the H200
# profile's price of a context token (profiles/h200/qwen3-0.6b.csv, decode_graph)
pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")

KERNEL = DecodePrograms(num_kv_heads=8, num_layers=28, key_bytes=512, num_sms=132, program_bandwidth=12.9e9)
PER_TOKEN = 2.616e-8
LONG = (2048, 6144)  # the long class's prompts


def ragged(batch: int, seed: int = 0) -> list[int]:
    return [int(c) for c in np.random.default_rng(seed).integers(*LONG, batch)]


def test_the_longest_programs_hold_a_step_just_past_two_programs_per_sm():
    # 32 sequences: split to four programs per SM, the memory stays busy; 33: one program of the
    # mean context per (sequence, head), fewer than the bandwidth needs once the short ones are done
    below, above = ([KERNEL.excess_s(ragged(b, seed), PER_TOKEN) for seed in range(5)] for b in (32, 33))
    assert max(below) < 1e-4
    assert 0.8e-3 < min(above) and max(above) < 1.6e-3  # measured on the H200: +1.2 ms at 33 (run2 README)
    # further from the switch there are more programs in flight, and the wait shrinks
    assert KERNEL.excess_s(ragged(48), PER_TOKEN) < KERNEL.excess_s(ragged(36), PER_TOKEN)
    assert KERNEL.excess_s(ragged(224), PER_TOKEN) == 0.0


def test_an_even_batch_of_many_programs_and_a_small_batch_wait_on_nothing():
    assert KERNEL.excess_s([1000] * 256, PER_TOKEN) == 0.0
    assert KERNEL.excess_s([], PER_TOKEN) == 0.0 and KERNEL.excess_s([0, 0], PER_TOKEN) == 0.0
    # a few short programs below two per SM: the profile's grid measured them, its price holds them
    assert KERNEL.excess_s([128], PER_TOKEN) == 0.0 and KERNEL.excess_s([128] * 8, PER_TOKEN) == 0.0
    # 33 sequences, one of them padding: 32 real, below two programs per SM
    assert KERNEL.excess_s([*ragged(32), 0], PER_TOKEN) == 0.0


@settings(max_examples=200, deadline=None)
@given(lens=st.lists(st.integers(0, 8192), min_size=1, max_size=300), heads=st.sampled_from([1, 2, 4, 8]),
       sms=st.sampled_from([108, 132]), rate=st.floats(1e9, 1e11))
def test_the_programs_are_the_kernels_and_the_wait_is_bounded(lens, heads, sms, rate):
    kernel = dataclasses.replace(KERNEL, num_kv_heads=heads, num_sms=sms, program_bandwidth=rate)
    keys = kernel.programs(lens)
    real = np.array([n for n in lens if n > 0])
    assert keys.sum() == real.sum() and (np.diff(keys) >= 0).all()
    if real.size:
        # the kernel's own rule (kernels.decode_split), at the split count of an eager launch
        splits = choose_num_splits(real.size, heads, int(real.max()), sms, balanced=True)
        chunks = split_chunks(real, splits, balanced_chunk(real, heads, sms))
        assert len(keys) == int((-(-real // chunks)).sum()) and keys.max() == np.minimum(real, chunks).max()
        assert fair_share(real.size, int(real.sum()), heads, sms) == balanced_chunk(real, heads, sms)
    excess = kernel.excess_s(lens, PER_TOKEN)
    # never negative; never more than the longest program walking alone at its rate
    assert excess >= 0.0
    longest = keys.max() if keys.size else 0
    assert excess <= kernel.num_layers * longest * kernel.key_bytes / rate * (1 + 1e-9)
    # a slower program waits at least as long
    slower = dataclasses.replace(kernel, program_bandwidth=rate / 2)
    assert slower.excess_s(lens, PER_TOKEN) >= excess - 1e-15


@settings(max_examples=200, deadline=None)
@given(lens=st.lists(st.integers(0, 8192), min_size=1, max_size=300), pad=st.integers(0, 64),
       context=st.integers(1, 40960), heads=st.sampled_from([1, 2, 4, 8]))
def test_in_a_graph_the_programs_are_those_of_its_captured_split_count(lens, pad, context, heads):
    kernel = dataclasses.replace(KERNEL, num_kv_heads=heads)
    real = np.array([n for n in lens if n > 0])
    graph = (len(lens) + pad, context)  # its batch size, padding rows included, and capture context
    keys = kernel.programs(lens, graph)
    assert keys.sum() == real.sum()
    if real.size:
        # the kernel's rule at the split count the engine's capture fixed (engine.cuda_graph:
        # the graph's rows and max_model_len as the hint), whatever the step's own contexts
        splits = choose_num_splits(graph[0], heads, context, kernel.num_sms, balanced=True)
        chunks = split_chunks(real, splits, balanced_chunk(real, heads, kernel.num_sms))
        assert len(keys) == int((-(-real // chunks)).sum()) and keys.max() == np.minimum(real, chunks).max()


def test_a_graph_cuts_short_ragged_contexts_at_the_fair_share_where_an_eager_launch_does_not():
    # 36 sequences of 100-1,024 keys (the bursty class's, mean about 560): an eager launch takes one
    # split from its longest context, so its longest sequence walks whole; a graph captured for
    # 16,384 keeps 16 splits, and no program walks more than the fair share (the mean, in tiles)
    lens = [int(n) for n in np.random.default_rng(3).integers(100, 1025, 36)]
    fair = fair_share(len(lens), sum(lens), 8, 132)
    eager, graph = KERNEL.programs(lens), KERNEL.programs(lens, (48, 16384))
    assert KERNEL.split_count(np.array(lens)) == 1 and KERNEL.split_count(np.array(lens), (48, 16384)) == 16
    assert graph.max() == fair < eager.max() == max(lens)
    assert KERNEL.excess_s(lens, PER_TOKEN, (48, 16384)) < KERNEL.excess_s(lens, PER_TOKEN)
    # long contexts: both cut at the fair share, the same programs
    long = ragged(36)
    assert (KERNEL.programs(long) == KERNEL.programs(long, (48, 16384))).all()


def test_the_profiled_model_prices_a_graph_step_at_its_captured_split_count():
    from engine.core.graph_sizes import GraphSizes

    rc, _ = _profiled()
    _, off = _profiled("backend.decode_programs=false")
    sizes = (1, 2, 4, 8, 16, 32, 48, 64)
    captured = make_cost_model(rc.model, rc.hardware, rc.sim, GraphSizes(sizes, (), 16384))
    unknown = make_cost_model(rc.model, rc.hardware, rc.sim, sizes)  # no capture context: as eager
    contexts = [int(n) for n in np.random.default_rng(3).integers(100, 1024, 36)]
    step = decode_batch(contexts)
    lens = [c + 1 for c in contexts]
    per_token = dict(zip(off.fits["decode_graph"].linear_features, off.fits["decode_graph"].linear_coefs))
    price = per_token["decode_context_tokens"]
    assert captured.step_time(step) - off.step_time(step) == pytest.approx(
        KERNEL.excess_s(lens, price, (48, 16384)), rel=1e-9, abs=1e-12)
    assert unknown.step_time(step) - off.step_time(step) == pytest.approx(KERNEL.excess_s(lens, price), rel=1e-9)
    assert captured.step_time(step) < unknown.step_time(step)
    for j, (repeat, plain) in enumerate(zip(captured.decode_repeats(step), off.decode_repeats(step)), start=1):
        assert repeat - plain == pytest.approx(KERNEL.excess_s([n + j for n in lens], price, (48, 16384)),
                                               rel=1e-9, abs=1e-12)
        if j == 2:
            break


def test_bad_figures_are_refused():
    for field, value in (("num_sms", 0), ("num_kv_heads", 1.5), ("program_bandwidth", 0.0), ("resident_per_sm", 0)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(KERNEL, **{field: value})


def test_programs_past_the_gpus_slots_run_as_a_last_wave():
    # 5 programs per SM x 132 SMs = 660 slots: 82 even sequences x 8 heads fit; 84 leave 12 programs
    # waiting until the first 660, walking alike, end together; those 12 then walk at the program rate
    waves = dataclasses.replace(KERNEL, resident_per_sm=5)
    assert waves.excess_s([1000] * 82, PER_TOKEN) == KERNEL.excess_s([1000] * 82, PER_TOKEN) == 0.0
    bandwidth = 8 * 28 / PER_TOKEN  # head-keys/s
    rate = KERNEL.program_bandwidth / KERNEL.key_bytes
    expected = 28 * (1000 / rate - 12 * 1000 / bandwidth)
    assert waves.excess_s([1000] * 84, PER_TOKEN) == pytest.approx(expected, rel=1e-9)
    assert KERNEL.excess_s([1000] * 84, PER_TOKEN) == 0.0
    # more waiting programs share the bandwidth again: a fuller last wave waits less
    assert waves.excess_s([1000] * 120, PER_TOKEN) < waves.excess_s([1000] * 90, PER_TOKEN)
    # the launch order is the kernel's grid: split-major, then KV head, then sequence
    real = np.array([3000, 500, 2000])
    order = waves.launch_order([3000, 500, 0, 2000])
    chunks = split_chunks(real, choose_num_splits(3, 8, 3000, 132, balanced=True), balanced_chunk(real, 8, 132))
    assert order.sum() == 8 * real.sum() and (order[:24] == np.tile(np.minimum(real, chunks), 8)).all()


@settings(max_examples=100, deadline=None)
@given(lens=st.lists(st.integers(0, 4096), min_size=1, max_size=200), pad=st.integers(0, 32),
       context=st.sampled_from([1024, 4096, 16384]))
def test_a_graphs_split_count_drives_its_launch_order_and_its_waves(lens, pad, context):
    # the launch order is the graph's programs, every KV head's, first pieces first: the same
    # multiset as programs(graph) and not the eager launch's where their split counts differ
    waves = dataclasses.replace(KERNEL, resident_per_sm=5)
    graph = (len(lens) + pad, context)
    order = waves.launch_order(lens, graph)
    assert np.array_equal(np.sort(order), np.sort(np.tile(waves.programs(lens, graph), 8)))
    real = np.array([n for n in lens if n > 0])
    if real.size:
        chunks = split_chunks(real, waves.split_count(real, graph), balanced_chunk(real, 8, 132))
        assert np.array_equal(order[:8 * real.size], np.tile(np.minimum(real, chunks), 8))
        # priced on the graph's programs: the same as walking its launch order on the slots
        if waves.applies(int(real.size)) and 8 * int((-(-real // chunks)).sum()) > 660:
            bandwidth, rate = 8 * 28 / PER_TOKEN, KERNEL.program_bandwidth / KERNEL.key_bytes
            fluid = walk_seconds(order, 660, bandwidth, rate)
            expected = max(0.0, 28 * (fluid - 8 * float(real.sum()) / bandwidth))
            assert waves.excess_s(lens, PER_TOKEN, graph) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(0, 5000), min_size=1, max_size=400), slots=st.integers(1, 500),
       bandwidth=st.floats(1e6, 1e9), rate=st.floats(1e4, 1e8))
def test_a_launch_on_few_slots_is_bounded_by_its_schedule(keys, slots, bandwidth, rate):
    walked = np.array(keys, dtype=float)
    seconds = walk_seconds(walked, slots, bandwidth, rate)
    total, real = walked.sum(), walked[walked > 0]
    # never faster than the bandwidth or than its longest program alone
    assert seconds >= total / bandwidth * (1 - 1e-9) and seconds >= walked.max() / rate * (1 - 1e-9)
    # a list schedule ends within total / slots + the longest program (in keys walked), each key
    # walked at no less than min(rate, bandwidth / slots)
    assert seconds <= (total / slots + walked.max()) / min(rate, bandwidth / slots) * (1 + 1e-9)
    if real.size <= slots:  # room for all: they start together
        assert seconds == pytest.approx(walk_seconds(walked, None, bandwidth, rate), rel=1e-9)
    if slots == 1:  # one at a time
        assert seconds == pytest.approx(total / min(rate, bandwidth), rel=1e-9)


def _profiled(*overrides: str):
    rc = compose_run_config(["model=qwen3-0.6b", "hardware=h200", "backend=sim", "backend.cost_model=profiled",
                             *overrides])
    return rc, make_cost_model(rc.model, rc.hardware, rc.sim, (1, 2, 4, 8, 16, 32, 48, 64))


def test_the_profiled_model_adds_the_wait_to_decode_steps_and_to_their_repeats():
    rc, on = _profiled()
    _, off = _profiled("backend.decode_programs=false")
    kernel = dataclasses.replace(KERNEL, program_bandwidth=rc.hardware.decode_program_bandwidth,
                                 resident_per_sm=rc.hardware.decode_programs_per_sm)
    assert on.decode_programs == kernel and off.decode_programs is None
    step = decode_batch(ragged(33))
    # decode_batch's contexts are the tokens before the step: the kernel reads one more each
    lens = [e.num_computed_tokens + 1 for e in step.scheduled]
    per_token = dict(zip(off.fits["decode_graph"].linear_features, off.fits["decode_graph"].linear_coefs))
    expected = kernel.excess_s(lens, per_token["decode_context_tokens"])
    assert expected > 5e-4
    assert on.step_time(step) - off.step_time(step) == pytest.approx(expected, rel=1e-9)
    # the fast-forward's repeats are the step with every context j tokens longer
    for j, (priced_on, priced_off) in enumerate(zip(on.decode_repeats(step), off.decode_repeats(step)), start=1):
        grown = kernel.excess_s([n + j for n in lens], per_token["decode_context_tokens"])
        assert priced_on - priced_off == pytest.approx(grown, rel=1e-9)
        if j == 3:
            break
    # a step of 32 and a CPU without the figures: nothing added
    short = decode_batch(ragged(32))
    assert on.step_time(short) == pytest.approx(off.step_time(short), abs=1e-7)
    cpu = compose_run_config(["hardware=cpu"]).hardware
    assert decode_programs(rc.model, cpu, rc.sim) is None


def test_the_setting_is_a_bool():
    with pytest.raises(ValueError, match="decode_programs"):
        dataclasses.replace(compose_run_config([]).sim, decode_programs="yes")


def _one_at_a_time(keys: np.ndarray, slots: int) -> np.ndarray:
    """The list schedule by its definition: each program in order on the slot that frees first."""
    ends = [0.0] * slots
    starts = []
    for walked in keys.tolist():
        start = heapq.heappop(ends)
        starts.append(start)
        heapq.heappush(ends, start + walked)
    return np.array(starts)


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.one_of(st.integers(1, 5000), st.floats(0.5, 5000.0)), min_size=2, max_size=1500),
       slots=st.integers(1, 700))
def test_the_schedule_in_rounds_is_the_schedule_one_program_at_a_time(keys, slots):
    # equal floats, not close ones: the rounds and the heap they hand over to add the same keys in
    # the same order; few slots under many programs run past the rounds into the heap
    walked = np.array(keys, dtype=float)
    slots = min(slots, walked.size - 1)
    assert np.array_equal(list_schedule_starts(walked, slots), _one_at_a_time(walked, slots))


def test_used_splits_follow_the_graphs_split_count_and_the_fair_share():
    """One sequence in a graph of one captured for 8,192 tokens: 64 splits, pieces of at least a tile
    and of the fair share (its keys over four programs per SM), so the merge chain grows with the
    context until the split count caps it; a batch of 32 takes few pieces each."""
    programs = DecodePrograms(8, 28, 512, 132, 12.9e9)
    assert [int(programs.used_splits([n], (1, 8192))[0]) for n in (100, 512, 2048, 4096, 8000)] == [2, 8, 32, 64, 63]
    assert programs.used_splits([8000] * 32, (32, 8192)).tolist() == [3] * 32
    assert programs.used_splits([0, 300], (2, 8192)).tolist() == [5]  # padding takes none
