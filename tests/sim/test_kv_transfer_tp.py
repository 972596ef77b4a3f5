"""The simulated KV transfer between pools of two TP sizes (sim.kv_transfer): the decode pool's
bytes (replicated heads sent to each replica), over as many GPU links as the engine's head plan
keeps busy, written out here from the plan's pieces rather than from the pricer's rule."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.kv_heads import reshard_plan
from sim.kv_transfer import KVTransferPricer, TransferConfig
from tests.sim.helpers import hardware, model

H100, QWEN8B = hardware("h100"), model("qwen3-8b")  # 8 KV heads of 128, 36 layers, bf16
PER_HEAD_TOKEN = 2 * 36 * 128 * 2  # K and V of one head, all layers, bytes


def _pricer(spec, prefill_tp: int, decode_tp: int, **transfer) -> KVTransferPricer:
    return KVTransferPricer(TransferConfig(**transfer), spec, H100, H100, prefill_tp, decode_tp)


@pytest.mark.parametrize("prefill_tp, decode_tp, links", [
    (1, 1, 1), (1, 2, 1), (2, 1, 1), (2, 2, 2), (2, 4, 2), (8, 1, 1), (4, 8, 4), (1, 8, 1)])
def test_qwen3_8b_moves_all_heads_over_the_smaller_pools_links(prefill_tp, decode_tp, links):
    seconds, nbytes = _pricer(QWEN8B, prefill_tp, decode_tp).price(1000, 0, 0, 0.0)
    assert nbytes == 1000 * 8 * PER_HEAD_TOKEN  # 8 heads, none replicated (TP <= 8)
    assert seconds == pytest.approx(H100.nvlink_latency_s + nbytes / (links * H100.nvlink_bandwidth), rel=1e-12)


def test_replicated_heads_are_sent_to_every_replica_and_an_uneven_split_prices_the_busiest_gpu():
    mqa = dataclasses.replace(QWEN8B, num_kv_heads=1, name="one-kv-head")
    tokens, bw = 500, H100.nvlink_bandwidth
    # 1 head on 2 prefill ranks to 3 decode ranks: 3 copies; one prefill GPU sends two of them
    seconds, nbytes = _pricer(mqa, 2, 3, latency_s=0.0).price(tokens, 0, 0, 0.0)
    assert nbytes == 3 * tokens * PER_HEAD_TOKEN
    assert seconds == pytest.approx(2 * tokens * PER_HEAD_TOKEN / bw, rel=1e-12)
    # the same over min(tp) links would be 1.5 copies' time: the rule the plan corrects
    assert seconds > nbytes / (2 * bw)


@st.composite
def pools(draw):
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    sizes = [tp for tp in (1, 2, 3, 4, 6, 8, 16) if heads % tp == 0 or tp % heads == 0]
    return heads, draw(st.sampled_from(sizes)), draw(st.sampled_from(sizes))


@given(pools(), st.integers(1, 20_000))
def test_the_wire_time_is_the_busiest_gpus_bytes_of_the_engines_plan(pool, tokens):
    heads, prefill_tp, decode_tp = pool
    spec = dataclasses.replace(QWEN8B, num_kv_heads=heads, name=f"kv{heads}")
    seconds, nbytes = _pricer(spec, prefill_tp, decode_tp, latency_s=0.0).price(tokens, 0, 0, 0.0)
    plan = reshard_plan(heads, prefill_tp, decode_tp)
    sent = [sum(p.count for p in plan if p.src == r) for r in range(prefill_tp)]
    received = [sum(p.count for p in plan if p.dst == r) for r in range(decode_tp)]
    assert nbytes == sum(received) * tokens * PER_HEAD_TOKEN
    assert seconds == pytest.approx(max(*sent, *received) * tokens * PER_HEAD_TOKEN / H100.nvlink_bandwidth,
                                    rel=1e-12)
