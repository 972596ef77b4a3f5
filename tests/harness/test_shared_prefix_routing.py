"""harness.fidelity.routing.measured_shared_prefix: decided and fitted on the grid's shared-prefix rows."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from harness.fidelity.routing import SharedRouting, measured_shared_prefix, table_sequences, with_distinct_experts
from sim.moe_locality import SequenceRouting

MODEL = SimpleNamespace(is_moe=True, num_experts=128, num_experts_per_tok=8)


def shared_rows(observed=None, routing=None):
    """Decodes over one prefix and over 8 (routing groups), 32 and 128 of them, with these counts (or
    routing's expectation), and a chunk after a cached prefix (left out of the fit: its count is 1)."""
    table = pd.DataFrame({"set": "grid", "kind": ["shared_decode"] * 4 + ["shared_prefill"],
                          "num_prefill_tokens": [0, 0, 0, 0, 256], "num_decode_tokens": [32, 32, 128, 128, 0],
                          "num_seqs": [32, 32, 128, 128, 4], "prefill_context_tokens": [0, 0, 0, 0, 4096],
                          "moe_routing_groups": [1, 8, 1, 8, 1]})
    if routing is not None:
        observed = [routing.distinct(s) for s in table_sequences(table, True)]
    return table.assign(moe_distinct_experts=observed)


@pytest.mark.parametrize("locality", [0.0, 2.0])
def test_grouping_is_chosen_and_fitted_where_it_explains_the_counts(locality):
    table = shared_rows(routing=SequenceRouting(128, 8, 0.3, locality, 0.06, 3))
    table.loc[4, "moe_distinct_experts"] = 1.0  # a count the fit must not see
    shared = measured_shared_prefix(None, table, MODEL, 0.3, locality)
    assert shared.on and shared.fresh == pytest.approx(0.06, rel=0.05) and shared.cap == 3
    assert shared.meta() == {"moe_routing_shared_prefix": True, "moe_routing_shared_fresh": shared.fresh,
                             "moe_routing_shared_cap": 3}
    apart = shared_rows(routing=SequenceRouting(128, 8, 0.3, locality, 1.0))
    assert not measured_shared_prefix(None, apart, MODEL, 0.3, locality).on


def test_given_figures_are_not_fitted_and_given_off_wins():
    table = shared_rows([20.0, 60.0, 30.0, 70.0, 13.0])
    assert measured_shared_prefix(True, table, MODEL, 0.3, 2.0, 0.2, None) == SharedRouting(True, 0.2, None)
    assert measured_shared_prefix(False, table, MODEL, 0.3, 2.0) == SharedRouting()
    assert measured_shared_prefix(True, table, SimpleNamespace(is_moe=False), 0.3, 2.0) == SharedRouting()


def test_without_groups_or_counts_it_is_off_unless_given():
    table = shared_rows([20.0, 60.0, 30.0, 70.0, 13.0]).drop(columns="moe_routing_groups")
    assert measured_shared_prefix(None, table, MODEL, 0.3, 2.0) == SharedRouting()
    # given on without rows to fit: the group as one sequence (no figures)
    assert measured_shared_prefix(True, table, MODEL, 0.3, 2.0) == SharedRouting(True, None, None)
    assert SharedRouting(False, 0.2, 3).meta()["moe_routing_shared_fresh"] is None


def test_the_expectation_beside_the_counts_groups_with_the_figures():
    shared = SharedRouting(True, 0.06, 3)
    table = with_distinct_experts(shared_rows([20.0, 60.0, 30.0, 70.0, 13.0]), MODEL, 0.3, 2.0, shared)
    routing = SequenceRouting(128, 8, 0.3, 2.0, 0.06, 3)
    assert list(table["moe_expected_experts"]) == pytest.approx(
        [routing.distinct(s) for s in table_sequences(table, True)])
    assert list(table["moe_distinct_experts"]) == [20.0, 60.0, 30.0, 70.0, 13.0]  # measured counts kept
