"""The roofline model respects physical bounds, is monotone, and models tensor parallelism."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams, samples_by_shard
from sim.roofline import RooflineCostModel
from sim.roofline_comm import gathers_logits
from tests.sim import helpers
from tests.sim.helpers import decode, decode_batch, hardware, model, plan, prefill

MODELS = ["qwen3-0.6b", "qwen3-8b", "qwen3-32b"]


def _weights_read(spec):
    # Every weight but an untied input embedding (a gather of a few rows) is read by a sampling step.
    embedding = spec.vocab_size * spec.hidden_size * spec.dtype_bytes
    return spec.weight_bytes - (0 if spec.tie_word_embeddings else embedding)


def _linear_flops_per_token(spec):
    per_layer = 2 * spec.hidden_size * spec.num_heads * spec.head_dim \
        + 2 * spec.hidden_size * spec.num_kv_heads * spec.head_dim + 3 * spec.hidden_size * spec.intermediate_size
    return 2 * spec.num_layers * per_layer


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("hw", ["h100", "a100"])
@pytest.mark.parametrize("contexts", [[1], [100] * 8, [4000] * 64, list(range(1, 2048, 8))])
def test_decode_never_beats_memory_bandwidth(name, hw, contexts):
    spec, hardware_spec = model(name), hardware(hw)
    cost = RooflineCostModel(spec, hardware_spec)
    kv = spec.kv_bytes_per_token * sum(contexts)
    assert cost.step_time(decode_batch(contexts)) >= (_weights_read(spec) + kv) / hardware_spec.mem_bandwidth


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("tokens, cached", [(16384, 0), (4096, 8192), (512, 0)])
def test_prefill_never_beats_peak_flops(name, tokens, cached):
    spec, hw = model(name), hardware("h100")
    cost = RooflineCostModel(spec, hw)
    pairs = tokens * cached + tokens * (tokens + 1) // 2
    attention = 4 * spec.num_layers * spec.num_heads * spec.head_dim * pairs
    lm_head = 2 * spec.hidden_size * spec.vocab_size
    flops = _linear_flops_per_token(spec) * tokens + attention + lm_head
    assert cost.step_time(plan(prefill(tokens, cached))) >= flops / hw.peak_flops


def test_lm_head_only_for_sampled_positions():
    cost = RooflineCostModel(model("qwen3-8b"), hardware("h100"))
    sampled = cost.step_time(plan(prefill(1024, sample=True)))
    chunk = cost.step_time(plan(prefill(1024, sample=False)))
    assert cost.phase_times(1024, 0, 0, 0, 1)["lm_head"] == 0.0
    assert sampled > chunk


entries = st.lists(
    st.one_of(st.tuples(st.just("d"), st.integers(0, 8192)),
              st.tuples(st.just("p"), st.integers(1, 4096), st.integers(0, 8192))),
    min_size=1, max_size=40)


def _build(spec_list):
    built = []
    for i, item in enumerate(spec_list):
        built.append(decode(item[1], rid=str(i)) if item[0] == "d" else prefill(item[1], item[2], rid=str(i)))
    return built


@settings(max_examples=60, deadline=None)
@given(entries, st.sampled_from(["d", "p", "grow_new", "grow_context"]), st.integers(1, 512))
def test_more_work_is_never_cheaper(items, change, amount):
    cost = RooflineCostModel(model("qwen3-0.6b"), hardware("h100"))
    base = _build(items)
    more = _build(items)
    if change == "d":
        more.append(decode(amount, rid="extra"))
    elif change == "p":
        more.append(prefill(amount, rid="extra"))
    elif change == "grow_new":
        more[0].token_ids = more[0].token_ids * (1 if more[0].is_decode else 2)
    else:
        more[0].num_computed_tokens += amount
    assert cost.step_time(plan(*more)) >= cost.step_time(plan(*base))


def test_tensor_parallel_splits_compute_and_adds_communication():
    spec, hw = model("qwen3-8b"), hardware("h100")
    one, two = RooflineCostModel(spec, hw, 1), RooflineCostModel(spec, hw, 2)
    args = (16384, 1, 0, 16384 * 16385 // 2, 1)  # one large prefill: compute-bound
    p1, p2 = one.phase_times(*args), two.phase_times(*args)
    assert p2["linear"] == pytest.approx(p1["linear"] / 2, rel=1e-3)
    assert p2["attention"] == pytest.approx(p1["attention"] / 2, rel=1e-3)
    assert p1["communication"] == 0.0 and p2["communication"] > 0.0
    # communication grows with the activations exchanged
    assert two.phase_times(32, 1, 0, 32, 1)["communication"] < p2["communication"]
    # ring all-reduce, by hand: 2 * 36 + 1 collectives of 16384 x 4096 bf16 activations
    link = hw.interconnect_bandwidth * hw.interconnect_efficiency
    ring = 73 * (hw.interconnect_latency_s + 2 * (1 / 2) * 16384 * 4096 * 2 / link)
    # sampling: the ranks exchange their best tokens (one latency), or gather bf16 logits when a
    # row filters by top-k or top-p
    assert p2["communication"] == pytest.approx(ring + hw.interconnect_latency_s)
    gather = hw.interconnect_latency_s + (1 / 2) * spec.vocab_size * 2 / link
    assert two.phase_times(*args, whole_vocab=True)["communication"] == pytest.approx(ring + gather)


def test_one_shot_all_reduce_prices_decode_sized_steps_and_leaves_large_ones_to_the_ring():
    spec, hw = model("qwen3-8b"), hardware("h200")
    nccl, one_shot = RooflineCostModel(spec, hw, 2, "nccl"), RooflineCostModel(spec, hw, 2, "symmetric")
    link = hw.interconnect_bandwidth * hw.interconnect_efficiency
    gather = hw.interconnect_latency_s + (1 / 2) * spec.vocab_size * 2 / link
    # 140 decode tokens: 140 x 4096 bf16 = 1.1 MB, under the 4 MiB limit (engine.core.collectives)
    each = hw.one_shot_latency_s + (2 - 1) * 140 * 4096 * 2 / hw.one_shot_bandwidth
    assert one_shot.communication_time(140, 140, True) == pytest.approx(
        73 * each + 140 * (gather - hw.interconnect_latency_s) + hw.interconnect_latency_s)
    assert one_shot.communication_time(140, 140) == pytest.approx(73 * each + hw.interconnect_latency_s)
    assert one_shot.communication_time(140, 140) < 0.6 * nccl.communication_time(140, 140)
    # 512 tokens is the largest one-shot size at hidden 4096 in bf16; 513 goes to the ring
    assert one_shot.communication_time(513, 1) == pytest.approx(nccl.communication_time(513, 1))
    assert one_shot.communication_time(512, 1) < nccl.communication_time(512, 1)
    # the step's price carries the difference whole
    assert nccl.time_for(140, 140, 140_000, 140_140, 140) - one_shot.time_for(140, 140, 140_000, 140_140, 140) == \
        pytest.approx(nccl.communication_time(140, 140) - one_shot.communication_time(140, 140))


def test_a_top_p_row_makes_tensor_parallel_ranks_gather_the_logits():
    from engine.core.sampling_params import SamplingParams

    spec, hw = model("qwen3-8b"), hardware("h200")
    two = RooflineCostModel(spec, hw, 2)
    rows = [decode(1000, f"r{i}") for i in range(64)]
    plain = two.step_time(plan(*rows))
    rows[5] = dataclasses.replace(rows[5], sampling_params=SamplingParams(temperature=0.7, top_p=0.9))
    link = hw.interconnect_bandwidth * hw.interconnect_efficiency
    assert two.step_time(plan(*rows)) - plain == pytest.approx(64 * (1 / 2) * spec.vocab_size * 2 / link)
    # a row that does not sample (a prefill chunk short of its prompt's end) does not count
    rows[5] = dataclasses.replace(rows[5], sample=False)
    assert two.step_time(plan(*rows)) < plain
    # one rank: nothing to gather or exchange
    one = RooflineCostModel(spec, hw, 1)
    rows[5] = dataclasses.replace(rows[5], sample=True)
    assert one.step_time(plan(*rows)) == pytest.approx(one.step_time(plan(*[decode(1000, f"r{i}") for i in range(64)])))


def test_one_shot_all_reduce_needs_the_hardware_figures():
    spec, a100 = model("qwen3-8b"), hardware("a100")
    with pytest.raises(ValueError, match="A100.*no one_shot_latency_s.*all_reduce=symmetric"):
        RooflineCostModel(spec, a100, 2, "symmetric")
    # auto falls back to the ring where the one-shot launch was never measured, as the engine may
    auto, nccl = RooflineCostModel(spec, a100, 2, "auto"), RooflineCostModel(spec, a100, 2, "nccl")
    assert auto.communication_time(64, 64) == nccl.communication_time(64, 64)
    # and nothing changes without tensor parallelism
    assert RooflineCostModel(spec, a100, 1, "symmetric").communication_time(64, 64) == 0.0


@pytest.mark.parametrize("gpu, tp, mode, reported", [
    ("h200", 2, "auto", "symmetric"), ("h200", 2, "nccl", "nccl"), ("a100", 2, "auto", "nccl"),
    ("h200", 1, "auto", ""), ("h100", 2, "symmetric", "symmetric")])
def test_the_simulated_backend_reports_the_all_reduce_it_prices(gpu, tp, mode, reported):
    from engine.core.config import CacheConfig, ExecutionConfig, SchedulerConfig
    from sim import build_sim_executor
    from sim.config import SimConfig

    sim = SimConfig(execution=ExecutionConfig(tensor_parallel_size=tp, all_reduce=mode))
    executor = build_sim_executor(model("qwen3-8b"), hardware(gpu), sim, CacheConfig(num_blocks=100), SchedulerConfig())
    assert executor.info().all_reduce == reported


def test_decode_of_large_batch_is_bandwidth_bound_then_overhead_counts():
    hw = dataclasses.replace(hardware("h100"), step_overhead_s=0.0, seq_overhead_s=0.0)
    spec = model("qwen3-0.6b")
    cost = RooflineCostModel(spec, hw)
    contexts = [1000] * 256
    kv = spec.kv_bytes_per_token * (sum(contexts) + len(contexts))
    bw = hw.mem_bandwidth * hw.bandwidth_efficiency
    # attention of a big decode batch is pure KV traffic
    assert cost.phase_times(256, 256, sum(contexts), sum(c + 1 for c in contexts), 256)["attention"] == \
        pytest.approx(kv / bw)
    slow = dataclasses.replace(hw, step_overhead_s=1e-3, seq_overhead_s=1e-5)
    extra = RooflineCostModel(spec, slow).step_time(decode_batch(contexts)) - cost.step_time(decode_batch(contexts))
    assert extra == pytest.approx(1e-3 + 256e-5)


def test_rejects_tp_size_that_does_not_divide_heads():
    with pytest.raises(ValueError, match="tp_size=3"):
        RooflineCostModel(model("qwen3-8b"), hardware("h100"), tp_size=3)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 20000), st.integers(0, 512), st.integers(0, 10**6), st.integers(0, 10**9), st.integers(1, 512),
       st.sampled_from([1, 2, 4]))
def test_step_time_is_the_sum_of_the_phases(tokens, sampled, context, pairs, seqs, tp):
    cost = RooflineCostModel(model("qwen3-8b"), hardware("h100"), tp)
    phases = cost.phase_times(tokens, sampled, context, pairs, seqs)
    assert cost.time_for(tokens, sampled, context, pairs, seqs) == pytest.approx(sum(phases.values()), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(("qwen3-0.6b", "qwen3-8b", "qwen3-30b-a3b")), st.sampled_from(("h100", "h200")),
       st.sampled_from(((1, "nccl"), (2, "nccl"), (2, "symmetric"), (4, "nccl"))),
       st.lists(st.integers(1, 40_000), min_size=1, max_size=64), st.integers(0, 64), st.booleans(),
       st.integers(1, 3000), st.integers(1, 300))
def test_decode_run_prices_are_the_repeats_priced_one_by_one(name, gpu, tp, contexts, repeated, filters, first, count):
    """decode_run_prices' arrays equal decode_repeats' prices (and step_time of each repeat's plan),
    bit for bit: fast-forward's clock sums them."""
    tp_size, all_reduce = tp
    try:
        cost = RooflineCostModel(helpers.model(name), helpers.hardware(gpu), tp_size, all_reduce)
    except ValueError:  # a tensor-parallel size the model's heads do not split into
        return
    params = SamplingParams(top_k=5) if filters else SamplingParams()
    entries = [ScheduledRequest(f"d{i}", [1], c, [], True, params, 1, True) for i, c in enumerate(contexts)]
    n = len(entries)
    stats = StepStats(3, "decode", n, 0, n, 0, n, 0, 0, 0, repeated * 16, repeated * 16)
    plan = StepPlan(entries, stats)
    expected = list(itertools.islice(cost.decode_repeats(plan), first - 1, first - 1 + count))
    assert cost.decode_run_prices(plan, first, count) == expected
    shifted = [ScheduledRequest(e.request_id, [1], e.num_computed_tokens + first, [], True, params, 1, True)
               for e in entries]
    assert expected[0] == cost.step_time(StepPlan(shifted, stats))


@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.7]), st.sampled_from([-1, 5]),
                          st.sampled_from([1.0, 0.9])), max_size=8))
def test_gathers_logits_is_the_engine_rule_over_the_sampled_rows(rows):
    entries = [dataclasses.replace(decode(100, f"r{i}"), sample=sample,
                                   sampling_params=SamplingParams(temperature=t, top_k=k, top_p=p))
               for i, (sample, t, k, p) in enumerate(rows)]
    step = plan(*entries)
    assert gathers_logits(step) == (not samples_by_shard(e.sampling_params for e in entries if e.sample))
