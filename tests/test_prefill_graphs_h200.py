"""The prefill-graph calls' summary (experiments/fidelity/prefill_graphs_h200) over the committed files:
what its README reads off them, and a folder without the calls refused in one line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.fidelity.prefill_graphs_h200 import summary

FOLDER = Path(__file__).parents[1] / "experiments" / "fidelity" / "prefill_graphs_h200"


def test_graphs_to_the_token_budget_keep_the_engines_repeats_together():
    cells = summary.cells(FOLDER)
    engine = cells[cells["cost_model"] == "profiled"]
    spread = engine.groupby("call")["engine_spread"].max()
    assert spread["graphs16384"] < 0.03 < 0.15 < spread["graphs4096"]


def test_the_tile_maps_new_order_brings_one_prompt_graph_prefills_under_eager():
    rows = pd.read_csv(FOLDER / summary.ROWS)
    ratio = summary.graph_over_eager(rows)
    fresh = ratio.xs(0, level="prefill_context_tokens")
    assert (fresh.loc[[2048, 3072, 4096], "graphs4096"] > 1.05).all()
    assert (fresh.loc[[2048, 3072, 4096], "heads_fastest"] < 1.0).all()
    shapes = summary.between_calls(rows, "graphs4096", "heads_fastest")
    assert len(shapes) > 80 and 0.95 < shapes.median() < 0.99


def test_a_folder_without_the_calls_is_refused_in_one_line(tmp_path, capsys):
    assert summary.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "heldout.csv.gz" in err[0]
