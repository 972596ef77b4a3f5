"""The decode kernel's work split (kernels.decode_split), on the host: every key is walked by
exactly one program of the launch, a balanced chunk bounds the longest program of a ragged batch,
and an even batch keeps one program per sequence when the GPU is already full."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.decode_split import (
    BALANCE_CHUNK,
    MAX_BALANCE_PROGRAMS,
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    balanced_chunk,
    choose_num_splits,
    split_chunks,
)

H100_SMS, KV_HEADS, BLOCK_N = 132, 8, 64


@settings(max_examples=300, deadline=None)
@given(lens=st.lists(st.integers(0, 8192), min_size=1, max_size=600), kv_heads=st.sampled_from([1, 2, 8]),
       sms=st.sampled_from([16, 108, 132]), balanced=st.booleans(), graph=st.booleans())
def test_every_key_has_one_program_within_the_launch(lens, kv_heads, sms, balanced, graph):
    lens = np.array(lens)
    # a graph is captured for max_model_len and the largest batch; an eager launch for this batch
    hint = 8192 if graph else max(1, int(lens.max()))
    splits = choose_num_splits(len(lens), kv_heads, hint, sms, balanced)
    assert 1 <= splits <= MAX_SPLITS
    chunk = balanced_chunk(lens, kv_heads, sms, BLOCK_N) if balanced else None
    chunks = split_chunks(lens, splits, chunk, BLOCK_N)
    assert (chunks % BLOCK_N == 0).all() and (chunks >= BLOCK_N).all()
    used = np.maximum(1, -(-lens // chunks))
    # programs split*chunk .. cover 0..len-1 without overlap, and the launch has them all
    assert (used <= splits).all()
    assert ((used - 1) * chunks < np.maximum(lens, 1)).all() and (used * chunks >= lens).all()


def test_a_ragged_batch_is_cut_to_its_fair_share():
    # a tenth of the batch at 3,700 keys, the rest at 700 (the probe's "tail" batch), batch 48
    lens = np.array([3700] * 4 + [700] * 44)
    even = split_chunks(lens, choose_num_splits(48, KV_HEADS, 4096, H100_SMS), None)
    splits = choose_num_splits(48, KV_HEADS, 4096, H100_SMS, balanced=True)
    fair = balanced_chunk(lens, KV_HEADS, H100_SMS)
    balanced = split_chunks(lens, splits, fair)
    assert even.max() >= 3700  # one program walks the whole long sequence
    assert fair == -(-int(lens.mean()) // BLOCK_N) * BLOCK_N
    assert balanced.max() <= max(fair, BALANCE_CHUNK)
    assert -(-3700 // balanced[0]) >= 3  # the long ones spread over several programs


def test_an_even_full_batch_keeps_one_program_per_sequence():
    for batch in (48, 64, 256, 512):
        lens = np.full(batch, 1000)
        splits = choose_num_splits(batch, KV_HEADS, 4096, H100_SMS, balanced=True)
        chunks = split_chunks(lens, splits, balanced_chunk(lens, KV_HEADS, H100_SMS))
        assert (-(-lens // chunks) == 1).all(), batch


def test_small_batches_fill_the_gpu_as_before():
    # one long sequence: many splits, each at least the minimum chunk; balancing changes nothing
    s = choose_num_splits(1, 8, 8192, 132)
    assert s > 8 and 8192 / s >= MIN_TOKENS_PER_SPLIT
    assert choose_num_splits(1, 8, 8192, 132, balanced=True) == s
    lens = np.array([2000])
    assert split_chunks(lens, s, balanced_chunk(lens, 8, 132))[0] == split_chunks(lens, s, None)[0]
    # a large batch already has enough programs: no split unless balanced, which keeps room
    assert choose_num_splits(256, 8, 8192, 132) == 1
    assert choose_num_splits(256, 8, 8192, 132, balanced=True) == 8192 // BALANCE_CHUNK
    # short contexts are not split below the minimum chunk
    assert choose_num_splits(1, 8, 300, 132) == -(-300 // MIN_TOKENS_PER_SPLIT)


def test_the_launch_room_for_long_models_is_bounded():
    # max_model_len 40,960: room for 40 pieces would launch 164k programs at batch 512, mostly idle
    for batch in (48, 64, 256, 512):
        splits = choose_num_splits(batch, KV_HEADS, 40960, H100_SMS, balanced=True)
        assert splits * batch * KV_HEADS <= max(MAX_BALANCE_PROGRAMS, 4 * H100_SMS)
        assert splits >= min(40960 // BALANCE_CHUNK, MAX_BALANCE_PROGRAMS // (batch * KV_HEADS))
    # a 4,096-token model keeps its room at every batch size up to 512
    assert all(choose_num_splits(b, KV_HEADS, 4096, H100_SMS, balanced=True) >= 4 for b in (33, 128, 512))


def test_padding_rows_and_empty_batches():
    assert balanced_chunk(np.zeros(16, int), 8, 132) == BLOCK_N
    with_padding = np.array([1000] * 40 + [0] * 8)
    assert balanced_chunk(with_padding, 8, 132) == balanced_chunk(with_padding[:40], 8, 132)
