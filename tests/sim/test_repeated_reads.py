"""Repeated KV reads (a shared prefix's blocks read by several sequences of a step) in the cost
models: nothing changes for steps that share nothing, the roofline and the prior price the
repeats at L2's bandwidth, and a fit on a profile with shared steps recovers their price."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from engine.core.config import SchedulerConfig
from engine.core.graph_sizes import GraphSizes, decode_graph_sizes, prefill_graph_sizes
from harness.calibration.profiling import ProfileGrid, profile_executor
from sim.features import step_features
from sim.profiled import ProfiledCostModel
from sim.repeated_reads import REPEATED_READS, l2_price_ratio, with_prior
from sim.roofline import RooflineCostModel
from sim.transfer import transfer
from tests.sim.helpers import LawExecutor, decode, decode_batch, hardware, model, plan, prefill

pytestmark = pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
GRAPHS = GraphSizes(decode_graph_sizes(512, 512), prefill_graph_sizes(4096))
H100_PROFILE = "profiles/h100/qwen3-0.6b.csv"
PLANS = [decode_batch([1300] * 8), decode_batch(list(range(100, 100 + 64 * 30, 30))), decode_batch([2048] * 256),
         decode_batch([500] * 600), plan(prefill(300, 1024)),
         plan(*(prefill(64, 1024, rid=f"p{i}") for i in range(16))),
         plan(prefill(5000, 0)), plan(prefill(512, 0), *(decode(1100, rid=f"d{i}") for i in range(64)))]
# What the code before repeated reads were priced predicted for PLANS (none shares a block): the
# shipped H100 profile of Qwen3-0.6B (executor time), and the roofline.
BEFORE = {
    "profiled": [0.0019028848185325886, 0.003856614569405401, 0.02104827186151909, 0.005294469026509378,
                 0.0023855156833473986, 0.0038512193837046834, 0.01840555298331091, 0.005264421852811333],
    ("qwen3-0.6b", "h100"): [0.001879373646055437, 0.004631335437100213, 0.024144714371002136, 0.01938169094165544,
                             0.0017501472818142424, 0.003113888159203556, 0.014916610927646987,
                             0.005114460483206378],
    ("qwen3-8b", "h200"): [0.004966058571428572, 0.0075321890476190475, 0.026399338954450447, 0.028685129245921814,
                           0.007121510331945523, 0.02111810897758082, 0.10962951987202608, 0.014407600939719727],
}


def shared(step, repeated: int, decode_repeated: int | None = None):
    """step with its stats saying it reads `repeated` KV tokens again (decode_repeated of them by decodes)."""
    decode_repeated = repeated if decode_repeated is None else decode_repeated
    stats = dataclasses.replace(step.stats, repeated_kv_tokens=repeated, decode_repeated_kv_tokens=decode_repeated)
    return dataclasses.replace(step, stats=stats)


def test_steps_that_share_nothing_are_priced_as_before():
    profiled = with_prior(ProfiledCostModel.load(H100_PROFILE, GRAPHS), hardware("h100"))
    assert [profiled.predict_features(step_features(p, GRAPHS)) for p in PLANS] == pytest.approx(BEFORE["profiled"],
                                                                                                  rel=1e-12)
    for key in (("qwen3-0.6b", "h100"), ("qwen3-8b", "h200")):
        roofline = RooflineCostModel(model(key[0]), hardware(key[1]))
        assert [roofline.step_time(p) for p in PLANS] == pytest.approx(BEFORE[key], rel=1e-12)


def test_roofline_prices_a_repeated_token_at_l2_bandwidth():
    h100 = hardware("h100")
    roofline = RooflineCostModel(model("qwen3-0.6b"), h100)
    step = decode_batch([2048] * 256)  # memory-bound attention
    repeated = 255 * 1024
    saved = roofline.step_time(step) - roofline.step_time(shared(step, repeated))
    kv = model("qwen3-0.6b").kv_bytes_per_token
    efficiency = h100.bandwidth_efficiency
    per_token = kv / (h100.mem_bandwidth * efficiency) - kv / (h100.l2_bandwidth * efficiency)
    assert saved == pytest.approx(per_token * repeated, rel=1e-9)
    no_l2 = RooflineCostModel(model("qwen3-0.6b"), dataclasses.replace(h100, l2_bandwidth=None))
    assert no_l2.step_time(shared(step, repeated)) == no_l2.step_time(step)


def test_prior_discounts_repeats_by_the_l2_to_memory_price_ratio():
    base = ProfiledCostModel.load(H100_PROFILE, GRAPHS)
    h100 = hardware("h100")
    ratio = l2_price_ratio(h100)
    assert ratio == pytest.approx(3.35 / 8.986)
    priced = with_prior(base, h100)
    step = decode_batch([1300] * 128)
    features = step_features(step, GRAPHS)
    first = dict(zip(base.fits["decode_graph"].linear_features, base.fits["decode_graph"].linear_coefs))
    a = first["decode_context_tokens"]
    repeated = 120 * 1024
    with_repeats = step_features(shared(step, repeated), GRAPHS)
    assert priced.predict_features(with_repeats) == pytest.approx(
        base.predict_features(features) - (1 - ratio) * a * repeated, rel=1e-12)
    # launches are host work, and a fit that priced repeats itself keeps its price
    assert REPEATED_READS not in priced.fits["launch:decode_graph"].linear_features
    assert with_prior(priced, h100) is priced
    assert with_prior(base, dataclasses.replace(h100, l2_bandwidth=None)) is base


def test_transfer_carries_the_l2_price_and_the_memory_price_apart():
    h100, h200 = hardware("h100"), hardware("h200")
    source = with_prior(ProfiledCostModel.load(H100_PROFILE, GRAPHS), h100)
    moved = transfer(source, h100, h200, model("qwen3-0.6b"))
    fit, before = moved.fits["decode_graph"], source.fits["decode_graph"]
    coef = dict(zip(fit.linear_features, fit.linear_coefs))
    a = dict(zip(before.linear_features, before.linear_coefs))["decode_context_tokens"]
    # an L2 read costs the same on both (same L2), a first read 3.35 / 4.8 as much
    assert coef["decode_context_tokens"] + coef[REPEATED_READS] == pytest.approx(a * 3.35 / 8.986)
    # the prior applied on the H200 directly says the same
    assert coef[REPEATED_READS] == pytest.approx(-(1 - l2_price_ratio(h200)) * coef["decode_context_tokens"])


# seconds per decode KV token read from memory, saved per token read again, per prefill pair, and
# saved per prefill context token read again
KV, DECODE_SAVING, PAIR, PREFILL_SAVING = 4e-9, 2.5e-9, 1e-10, 3e-10


def true_cost(f: dict) -> float:
    tokens = f["graph_batch_size"] if f["cuda_graph"] else f["num_tokens"]
    return (1e-3 + 2e-5 * tokens + PAIR * f["prefill_attention_pairs"] + KV * f["decode_context_tokens"]
            - DECODE_SAVING * f["decode_repeated_tokens"] - PREFILL_SAVING * f["prefill_repeated_tokens"])


def test_a_fit_on_the_grid_recovers_the_price_of_repeated_reads():
    sched = SchedulerConfig(max_model_len=8192, max_num_batched_tokens=16384)
    grid = ProfileGrid(warmup=0, repeats=1, min_repeats=1, long_prefill_tokens=(), num_random=0)
    profile = profile_executor(LawExecutor(true_cost, GRAPHS), sched, grid)
    assert (profile["decode_repeated_tokens"] > 0).sum() >= 20 and (profile["prefill_repeated_tokens"] > 0).sum() >= 4
    fitted = ProfiledCostModel.fit(profile, GRAPHS)
    for regime in ("decode_graph", "decode_eager", "prefill_graph"):
        coef = dict(zip(fitted.fits[regime].linear_features, fitted.fits[regime].linear_coefs))
        assert coef["decode_repeated_tokens"] == pytest.approx(-DECODE_SAVING, rel=0.02), regime
    coef = dict(zip(fitted.fits["prefill_graph"].linear_features, fitted.fits["prefill_graph"].linear_coefs))
    assert coef["prefill_repeated_tokens"] == pytest.approx(-PREFILL_SAVING, rel=0.02)
    # shapes it never saw: random batches sharing prefixes
    held_out = profile_executor(LawExecutor(true_cost, GRAPHS), sched, dataclasses.replace(
        grid, prefill_tokens=(), decode_batches=(), mixed_prefill_tokens=(), shared_prefix_tokens=(),
        num_random_shared=20, seed=7))
    assert len(held_out) >= 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = fitted.predict(held_out)
    assert predicted == pytest.approx(held_out["duration_s"].to_numpy(), rel=0.02)
