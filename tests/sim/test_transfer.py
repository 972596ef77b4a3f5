"""The H100 -> H200 transfer scales each part of a fitted profiled model as sim.transfer documents."""

from __future__ import annotations

import dataclasses

import pytest

from sim.piecewise import PiecewiseLinearFit
from sim.profiled import ProfiledCostModel
from sim.transfer import transfer
from tests.sim.helpers import hardware

H100, H200 = hardware("h100"), hardware("h200")
BW = H100.mem_bandwidth / H200.mem_bandwidth  # 3.35 / 4.8


def _fit(size, knots, linear):
    return PiecewiseLinearFit(size, tuple(knots), tuple(1e-3 * (i + 1) for i in range(len(knots))),
                              tuple(linear), tuple(1e-9 * (i + 1) for i in range(len(linear))),
                              ((size, knots[0], knots[-1]),))


@pytest.fixture()
def model():
    fits = {
        "prefill": _fit("num_tokens", [16, 295, 4096], ["prefill_attention_pairs", "decode_context_tokens", "num_seqs"]),
        "decode_graph": _fit("graph_batch_size", [1, 64, 512], ["decode_context_tokens", "num_seeded"]),
        "host": _fit("num_seqs", [1, 512], ["num_prefill_tokens"]),
        "launch:prefill": _fit("num_tokens", [16, 4096], ["num_seqs"]),
        "gpu:decode_graph": _fit("graph_batch_size", [1, 512], ["decode_context_tokens"]),
    }
    m = ProfiledCostModel(fits)
    m.launch_delay_s = 0.002
    return m


def test_h100_to_h200_scales_memory_bound_parts_by_bandwidth_and_keeps_compute(model):
    moved = transfer(model, H100, H200)
    prefill, before = moved.fits["prefill"], model.fits["prefill"]
    # 16 tokens: memory-bound on both; 4096: compute-bound, and both GPUs have the same peak FLOP/s
    assert prefill.knot_values[0] == pytest.approx(before.knot_values[0] * BW)
    assert prefill.knot_values[2] == pytest.approx(before.knot_values[2])
    # 295 tokens sits at the H100's ridge (F/B); on the H200 (ridge 206) it is compute-bound
    assert prefill.knot_values[1] == pytest.approx(before.knot_values[1] * max(295 / H200.peak_flops, 1 / H200.mem_bandwidth)
                                                   / max(295 / H100.peak_flops, 1 / H100.mem_bandwidth))
    coefs = dict(zip(prefill.linear_features, prefill.linear_coefs))
    old = dict(zip(before.linear_features, before.linear_coefs))
    assert coefs["prefill_attention_pairs"] == pytest.approx(old["prefill_attention_pairs"])
    assert coefs["decode_context_tokens"] == pytest.approx(old["decode_context_tokens"] * BW)
    assert coefs["num_seqs"] == old["num_seqs"]
    decode = moved.fits["decode_graph"]
    assert decode.knot_values == pytest.approx([v * BW for v in model.fits["decode_graph"].knot_values])
    assert dict(zip(decode.linear_features, decode.linear_coefs))["num_seeded"] == model.fits["decode_graph"].linear_coefs[1]
    assert moved.fits["gpu:decode_graph"].knot_values == pytest.approx(
        [v * BW for v in model.fits["gpu:decode_graph"].knot_values])
    assert moved.fits["host"] == model.fits["host"] and moved.fits["launch:prefill"] == model.fits["launch:prefill"]
    assert moved.launch_delay_s == model.launch_delay_s
    assert moved.fits["prefill"].ranges == model.fits["prefill"].ranges


def test_a_faster_compute_peak_shortens_compute_bound_parts(model):
    faster = dataclasses.replace(H100, name="2x", peak_flops=2 * H100.peak_flops)
    moved = transfer(model, H100, faster)
    assert moved.fits["prefill"].knot_values[2] == pytest.approx(model.fits["prefill"].knot_values[2] / 2)
    assert moved.fits["prefill"].knot_values[0] == pytest.approx(model.fits["prefill"].knot_values[0])
    assert moved.fits["decode_graph"].knot_values == pytest.approx(model.fits["decode_graph"].knot_values)


def test_same_hardware_is_identity(model):
    moved = transfer(model, H100, H100)
    for name, fit in model.fits.items():
        assert moved.fits[name].knot_values == pytest.approx(fit.knot_values)
        assert moved.fits[name].linear_coefs == pytest.approx(fit.linear_coefs)
