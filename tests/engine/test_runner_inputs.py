"""The runner's input building against a per-token reference, and its KV-cache sizing on CPU.

No model is needed: prepare() only reads the plan, so a stand-in module carries the dtype.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.plan import ScheduledRequest, StepPlan, StepStats
from engine.core.sampling_params import SamplingParams
from engine.kv_sizing import CPU_KV_CACHE_BYTES
from engine.runner import ModelRunner

HF_CONFIG = {
    "model_type": "qwen3", "vocab_size": 50, "hidden_size": 8, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 16,
}


class _StandIn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))


def _runner(block_size: int, num_blocks: int | None = None, **scheduler) -> ModelRunner:
    return ModelRunner(_StandIn(), HF_CONFIG, EngineConfig(model="unused"), SchedulerConfig(**scheduler),
                       CacheConfig(block_size=block_size, num_blocks=num_blocks), torch.device("cpu"))


def _plan(entries: list[ScheduledRequest]) -> StepPlan:
    return StepPlan(entries, StepStats(0, "mixed", len(entries), 0, 0, 0, 0, 0, 0, 0))


@st.composite
def _entries(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    n = draw(st.integers(1, 6))
    # Distinct physical blocks in scattered order, as the block manager hands them out.
    blocks = np.random.default_rng(draw(st.integers(0, 2**32))).permutation(1000).tolist()
    entries, used = [], 0
    for i in range(n):
        start = draw(st.integers(0, 30))
        length = draw(st.integers(1, 12))
        # The scheduler may hand a table longer than the context (a chunked prompt's blocks).
        count = -(-(start + length) // block_size) + draw(st.integers(0, 2))
        table = list(blocks[used:used + count])
        used += count
        tokens = draw(st.lists(st.integers(0, 49), min_size=length, max_size=length))
        entries.append(ScheduledRequest(f"r{i}", tokens, start, table, draw(st.booleans()), SamplingParams(),
                                        0, length == 1))
    return block_size, entries


@settings(max_examples=80, deadline=None)
@given(_entries())
def test_prepare_matches_a_per_token_reference(case):
    block_size, entries = case
    inputs = _runner(block_size).prepare(_plan(entries))
    ids, positions, slots, seq_lens, logits_rows = [], [], [], [], []
    for e in entries:
        for j, token in enumerate(e.token_ids):
            p = e.num_computed_tokens + j
            ids.append(token)
            positions.append(p)
            slots.append(e.block_table[p // block_size] * block_size + p % block_size)
        seq_lens.append(e.num_computed_tokens + len(e.token_ids))
        if e.sample:
            logits_rows.append(len(ids) - 1)
    meta = inputs.meta
    assert inputs.input_ids.tolist() == ids
    assert inputs.positions.tolist() == positions
    assert meta.slot_mapping.tolist() == slots
    assert meta.seq_lens.tolist() == seq_lens
    assert meta.query_start_loc.tolist() == [0, *np.cumsum([len(e.token_ids) for e in entries]).tolist()]
    assert inputs.logits_indices.tolist() == logits_rows
    assert inputs.sample_rows == [i for i, e in enumerate(entries) if e.sample]
    for i, e in enumerate(entries):
        needed = -(-seq_lens[i] // block_size)
        assert meta.block_tables[i, :needed].tolist() == e.block_table[:needed]
        assert not meta.block_tables[i, needed:].any()  # padded with 0
    assert meta.max_seq_len == max(seq_lens)
    assert meta.max_query_len == max(len(e.token_ids) for e in entries)
    assert meta.is_decode_only == all(len(e.token_ids) == 1 for e in entries)
    assert meta.query_start_loc.dtype == meta.seq_lens.dtype == meta.block_tables.dtype == torch.int32
    assert inputs.input_ids.dtype == inputs.positions.dtype == meta.slot_mapping.dtype == torch.int64


def test_kv_cache_layout_and_per_layer_views():
    runner = _runner(block_size=4, num_blocks=10)
    runner.allocate_kv_cache(runner.determine_num_blocks())
    assert runner.num_blocks == 10
    assert len(runner.kv_caches) == HF_CONFIG["num_hidden_layers"]
    k, v = runner.kv_caches[1]
    assert k.shape == v.shape == (10, 4, 2, 4)  # [num_blocks, block_size, num_kv_heads, head_dim]
    k.fill_(1.0)  # a view: writes land in the one allocation, in layer 1's K half only
    assert runner.kv_cache[1, 0].sum() == k.numel() and runner.kv_cache.sum() == k.numel()
    assert runner.block_bytes == 2 * 3 * 4 * 2 * 4 * 4


def test_cpu_default_block_count():
    # Small model: every sequence at full length fits the budget.
    small = _runner(block_size=16, max_num_seqs=4, max_model_len=100, max_num_batched_tokens=128)
    assert small.determine_num_blocks() == 4 * 7
    # Huge demand: capped by the budget.
    big = _runner(block_size=16, max_num_seqs=512, max_model_len=1 << 20, max_num_batched_tokens=1 << 20)
    per_seq = (1 << 20) // 16
    assert big.determine_num_blocks() == max(per_seq, CPU_KV_CACHE_BYTES // big.block_bytes)
    assert big.determine_num_blocks() >= per_seq  # one full-length request always fits
