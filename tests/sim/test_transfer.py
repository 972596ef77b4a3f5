"""The H100 -> H200 transfer scales each part of a fitted profiled model as sim.transfer documents,
and on measured fits of both GPUs it prices the H200's steps near the H200's own fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine.core.graph_sizes import GraphSizes, decode_graph_sizes, prefill_graph_sizes
from sim.features import step_features
from sim.piecewise import PiecewiseLinearFit
from sim.profiled import ProfiledCostModel
from sim.roofline import RooflineCostModel
from sim.transfer import elementwise_bytes, explained_base, transfer
from tests.sim.helpers import decode_batch, hardware, model, plan, prefill

H100, H200 = hardware("h100"), hardware("h200")
QWEN = model("qwen3-0.6b")
BW = H100.mem_bandwidth / H200.mem_bandwidth  # 3.35 / 4.8
FITS = Path(__file__).resolve().parents[2] / "experiments" / "fidelity"


def _fit(size, knots, linear, values=None):
    values = values or tuple(1e-3 * (i + 1) for i in range(len(knots)))
    return PiecewiseLinearFit(size, tuple(knots), tuple(values), tuple(linear),
                              tuple(1e-9 * (i + 1) for i in range(len(linear))), ((size, knots[0], knots[-1]),))


def _base(hw, regime, n):
    return explained_base(RooflineCostModel(QWEN, hw), regime, n)


@pytest.fixture()
def fitted():
    # decode knots: at the roofline's weights exactly, 1 ms of kernel floors above it, and below it
    decode_values = (_base(H100, "decode_graph", 1), _base(H100, "decode_graph", 64) + 1e-3,
                     0.5 * _base(H100, "decode_graph", 512))
    fits = {
        "prefill": _fit("num_tokens", [16, 4096], ["prefill_attention_pairs", "decode_context_tokens", "num_seqs"],
                        (_base(H100, "prefill", 16), 2 * _base(H100, "prefill", 4096))),
        "decode_graph": _fit("graph_batch_size", [1, 64, 512], ["decode_context_tokens", "num_seeded"], decode_values),
        "host": _fit("num_seqs", [1, 512], ["num_prefill_tokens"]),
        "launch:prefill": _fit("num_tokens", [16, 4096], ["num_seqs"]),
        "lead:prefill": _fit("num_tokens", [16, 4096], ["num_seqs"]),
        "gpu:decode_graph": _fit("graph_batch_size", [1, 512], ["decode_context_tokens"]),
    }
    m = ProfiledCostModel(fits)
    m.launch_delay_s = 0.002
    return m


def test_the_roofline_part_of_a_base_moves_with_the_specs_and_the_kernel_floors_stay(fitted):
    moved = transfer(fitted, H100, H200, QWEN)
    decode, before = moved.fits["decode_graph"].knot_values, fitted.fits["decode_graph"].knot_values
    # one sequence: the weights, memory-bound on both GPUs
    assert decode[0] == pytest.approx(before[0] * BW)
    # the floor above the roofline is kept as measured
    assert decode[1] - _base(H200, "decode_graph", 64) == pytest.approx(before[1] - _base(H100, "decode_graph", 64))
    # a knot below the roofline (collinear with its context terms) scales as a whole
    assert decode[2] == pytest.approx(before[2] * _base(H200, "decode_graph", 512) / _base(H100, "decode_graph", 512))
    prefill_knots = moved.fits["prefill"].knot_values
    assert prefill_knots[0] == pytest.approx(fitted.fits["prefill"].knot_values[0] * BW)
    # 4,096 tokens: GEMMs compute-bound on both (the same peak FLOP/s), elementwise kernels by bandwidth
    streamed = elementwise_bytes(QWEN) * 4096 / (H100.mem_bandwidth * H100.bandwidth_efficiency)
    assert prefill_knots[1] == pytest.approx(fitted.fits["prefill"].knot_values[1] - streamed * (1 - BW))


def test_elementwise_traffic_is_qwen3s_fused_kernels_per_token():
    """Per layer 8 hidden + 4 q + 7 kv + 3 intermediate elements (sim.transfer.elementwise_bytes),
    plus the final norm; Qwen3-0.6B: 28 layers of hidden 1,024, q 2,048, kv 1,024, intermediate 3,072."""
    per_layer = 8 * 1024 + 4 * 2048 + 7 * 1024 + 3 * 3072
    assert elementwise_bytes(QWEN) == 2 * (28 * per_layer + 4 * 1024)
    assert elementwise_bytes(QWEN, 2) < elementwise_bytes(QWEN)  # a rank's share of the heads and MLP


def test_linear_terms_follow_their_bound_and_host_work_is_kept(fitted):
    moved = transfer(fitted, H100, H200, QWEN)
    coefs = dict(zip(moved.fits["prefill"].linear_features, moved.fits["prefill"].linear_coefs))
    old = dict(zip(fitted.fits["prefill"].linear_features, fitted.fits["prefill"].linear_coefs))
    assert coefs["prefill_attention_pairs"] == pytest.approx(old["prefill_attention_pairs"])
    assert coefs["decode_context_tokens"] == pytest.approx(old["decode_context_tokens"] * BW)
    assert coefs["num_seqs"] == old["num_seqs"]
    decode = moved.fits["decode_graph"]
    seeded = dict(zip(decode.linear_features, decode.linear_coefs))["num_seeded"]
    assert seeded == fitted.fits["decode_graph"].linear_coefs[1]
    assert moved.fits["host"] == fitted.fits["host"] and moved.fits["launch:prefill"] == fitted.fits["launch:prefill"]
    assert moved.fits["lead:prefill"] == fitted.fits["lead:prefill"]  # host time before the device can start
    assert moved.launch_delay_s == fitted.launch_delay_s
    assert moved.fits["prefill"].ranges == fitted.fits["prefill"].ranges


def test_a_faster_compute_peak_shortens_only_the_compute_bound_roofline_part(fitted):
    faster = dataclasses.replace(H100, name="2x", peak_flops=2 * H100.peak_flops)
    moved = transfer(fitted, H100, faster, QWEN)
    long_chunk = _base(H100, "prefill", 4096)
    streamed = elementwise_bytes(QWEN) * 4096 / (H100.mem_bandwidth * H100.bandwidth_efficiency)
    # the GEMMs' half of the explained part halves; the elementwise traffic is bandwidth's
    assert moved.fits["prefill"].knot_values[1] == pytest.approx(2 * long_chunk - (long_chunk - streamed) / 2)
    assert _base(faster, "prefill", 4096) == pytest.approx(streamed + (long_chunk - streamed) / 2)
    assert moved.fits["prefill"].knot_values[0] == pytest.approx(fitted.fits["prefill"].knot_values[0])
    assert moved.fits["decode_graph"].knot_values[:2] == pytest.approx(fitted.fits["decode_graph"].knot_values[:2])


def test_same_hardware_is_identity(fitted):
    moved = transfer(fitted, H100, H100, QWEN)
    for name, fit in fitted.fits.items():
        assert moved.fits[name].knot_values == pytest.approx(fit.knot_values)
        assert moved.fits[name].linear_coefs == pytest.approx(fit.linear_coefs)


@pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
def test_an_h100_grid_fit_carried_prices_steps_near_the_h200s_own_grid_fit():
    """Both fits are grids profiled on the lent GPUs (Qwen3-0.6B; profiles/h200/): the
    carried H100 fit prices decode batches of 1-512 and prefill chunks of 256-8,192 tokens within
    15% of the H200's fit. Scaling the whole decode base by bandwidth was 20-29% short on TPOT."""
    graphs = GraphSizes(decode_graph_sizes(512, 512), prefill_graph_sizes(4096))
    h100 = ProfiledCostModel.load(FITS / "h100_shared_prefix" / "profile_model.csv.gz", graphs)
    h200 = ProfiledCostModel.load(FITS.parents[1] / "profiles" / "h200" / "qwen3-0.6b.csv", graphs)
    carried = transfer(h100, H100, H200, QWEN)
    steps = [decode_batch([context] * n) for n in (1, 8, 64, 256, 512) for context in (200, 1000, 3000)]
    steps += [plan(prefill(tokens)) for tokens in (256, 1024, 4096, 8192)]
    for step in steps:
        features = step_features(step, graphs)
        measured = h200.predict_features(features)
        assert carried.predict_features(features) == pytest.approx(measured, rel=0.15)
    uncarried = [h100.predict_features(step_features(s, graphs)) / h200.predict_features(step_features(s, graphs))
                 for s in steps]
    assert max(uncarried) > 1.3  # the H100's own prices would not do


@pytest.mark.filterwarnings("ignore::sim.profiled.ExtrapolationWarning")
def test_a_carried_fit_prices_long_prefills_device_time_as_the_h200s_own_fit():
    """Long prefills (code-completion prompts: graphs of 1-4k tokens, eager steps of 6-16k over 1-8
    prompts): the committed H100 fit carried prices their device time within 3.5% of the H200's own
    grid fit; the H100's own prices are 4-8% above it, which the GEMMs' roofline alone (the
    elementwise kernels kept as measured) carried unchanged, and queueing made that TTFT +20% on
    such traffic."""
    graphs = GraphSizes(decode_graph_sizes(512, 512), prefill_graph_sizes(4096))
    h100 = ProfiledCostModel.load(FITS / "h100_leakfree" / "profile_model.csv", graphs)
    h200 = ProfiledCostModel.load(FITS.parents[1] / "profiles" / "h200" / "qwen3-0.6b.csv", graphs)
    carried = transfer(h100, H100, H200, QWEN)
    shapes = [(1024, 1), (2048, 1), (4096, 1), (4096, 2), (6144, 1), (6144, 3), (8192, 4), (12288, 6), (16384, 8)]
    ratios = []
    for tokens, seqs in shapes:
        features = step_features(plan(*[prefill(tokens // seqs)] * seqs), graphs)
        own = h200.overlap_parts(features)[1]
        ratios.append(carried.overlap_parts(features)[1] / own)
        assert ratios[-1] == pytest.approx(1.0, abs=0.035)
    assert max(h100.overlap_parts(step_features(plan(*[prefill(t // s)] * s), graphs))[1]
               / h200.overlap_parts(step_features(plan(*[prefill(t // s)] * s), graphs))[1]
               for t, s in shapes) > 1.05  # the H100's own device times are not the H200's
