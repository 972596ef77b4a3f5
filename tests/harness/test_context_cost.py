"""experiments/fidelity/context_cost.py: the distinct experts a decode row's time implies, on a
profile whose sequences touch fewer experts at short contexts (as the 30B-A3B grid on random
weights does) and whose attention costs only the KV read."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from experiments.fidelity.context_cost import BANDWIDTH, implied_experts
from sim.moe import ExpertRouting
from sim.specs import ModelSpec, preset_fields

SPEC = ModelSpec(**preset_fields("qwen3-30b-a3b"))
SKEW, PER_EXPERT_S, BASE_S = 0.4, 1.7e-4, 4e-3


def _routed(batch: int, context: int) -> float:
    """Distinct experts: the expectation from a 1,000-token context on, fewer below (alike routing)."""
    expected = ExpertRouting(SPEC.num_experts, SPEC.num_experts_per_tok, SKEW).distinct(batch)
    return 8 + (expected - 8) * min(1.0, 0.4 + 0.6 * context / 1000)


def test_the_implied_experts_follow_the_routing_not_the_context():
    rng = np.random.default_rng(0)
    rows = []
    for batch in (1, 2, 4, 8, 16, 32):
        for context in (100, 500, 1000, 2000, 3000):
            distinct = _routed(batch, context)
            kv = batch * context * SPEC.kv_bytes_per_token / BANDWIDTH
            rows.append(dict(kind="decode", set="grid", cuda_graph=1, num_seqs=batch,
                             decode_context_tokens=batch * context, moe_distinct_experts=distinct,
                             moe_expected_experts=0.0,
                             duration_s=(BASE_S + PER_EXPERT_S * distinct + kv) * rng.normal(1, 0.002)))
    table = implied_experts(pd.DataFrame(rows), SPEC, SKEW)
    assert table.per_expert_ms.iloc[0] == pytest.approx(PER_EXPERT_S * 1e3, rel=0.02)
    assert table.implied.tolist() == pytest.approx(table.measured.tolist(), abs=1.5)
    short = table[(table.num_seqs == 8) & (table.context == 100)]
    assert short.implied.iloc[0] < 0.6 * short.expected.iloc[0]  # the context adds experts, not attention
