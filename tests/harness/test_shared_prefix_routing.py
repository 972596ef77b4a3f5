"""harness.fidelity.routing.measured_shared_prefix: decided on the grid's shared-prefix rows."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from harness.fidelity.routing import measured_shared_prefix, table_sequences
from sim.moe_locality import SequenceRouting

MODEL = SimpleNamespace(is_moe=True, num_experts=128, num_experts_per_tok=8)


def shared_rows(observed):
    """32 decodes over one prefix (one routing group) and 32 over 8 prefixes, with these counts."""
    return pd.DataFrame({"set": "grid", "kind": "shared_decode", "num_prefill_tokens": 0, "num_decode_tokens": 32,
                         "num_seqs": 32, "moe_routing_groups": [1, 8], "moe_distinct_experts": observed})


def test_grouping_is_chosen_where_it_explains_the_counts():
    routing = SequenceRouting(128, 8, 0.3, 2.0)
    table = shared_rows([0.0, 0.0])
    grouped = [routing.distinct(s) for s in table_sequences(table, True)]
    assert measured_shared_prefix(None, shared_rows(grouped), MODEL, 0.3, 2.0) is True
    apart = [routing.distinct([1] * 32)] * 2
    assert measured_shared_prefix(None, shared_rows(apart), MODEL, 0.3, 2.0) is False


def test_given_wins_and_without_a_locality_or_groups_it_is_off():
    table = shared_rows([20.0, 60.0])
    assert measured_shared_prefix(False, table, MODEL, 0.3, 2.0) is False
    assert measured_shared_prefix(None, table, MODEL, 0.3, 0.0) is False
    assert measured_shared_prefix(None, table.drop(columns="moe_routing_groups"), MODEL, 0.3, 2.0) is False
    assert measured_shared_prefix(True, table, SimpleNamespace(is_moe=False), 0.3, 2.0) is False
