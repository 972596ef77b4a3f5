"""The merge of a decode step's split partials, a term the decode fits take (SimConfig.decode_merge).

The engine's split-KV decode kernel cuts each (sequence, KV head) into programs; the last of a
sequence's programs to finish merges all their partial results, one after another, each a load past
L1 (kernels/decode_attention.py, _merge_group). A CUDA graph keeps the split count it was captured
with, many for few sequences (64 for one), and pieces are at least a tile and the batch's fair
share, so with few sequences the merge grows with the context up to the split count, and a step
waits on its longest (DecodePrograms.merge_splits). Timed on one H200 (Qwen3-0.6B), a price per
batch size + one per context token + 9.0 us a step per merged split fits decode graph steps of 1-32
sequences of 512-8,000 tokens within 2.0%; without it, up to 20.6%
(experiments/fidelity/small_batch_decode_h200). A profile's one price per context token holds the
grid's mean merge at each batch size, so few long sequences were priced short.

A grid fitted with decode_merge prices DECODE_MERGE_SPLITS in its decode fits (duration and device
time; launches and leads without it), kept where the rows give it a positive price. Its rows hold
only totals, so a grid row's contexts are the grid's spread of its sequences around their mean
(grid_spread_lens); a simulated step's are its sequences'. The split count is the launch's: a graph's
for its padded batch and the context it was captured for (GraphSizes.decode_context), an eager
step's from its own sequences. A grid fitted when it is loaded (a step-timing table as
profile_path) takes its graphs as captured for the run's max_model_len; one captured for another
(experiments/fidelity/run_gpu.sh profiles at 16,384) is fitted by experiments/fidelity/refit_merge.py
--graph-context and its coefficients given instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan
from sim.decode_programs import DECODE_MERGE_SPLITS, DecodePrograms, grid_spread_lens, launch_graph, plan_lens
from sim.piecewise import PiecewiseLinearFit


def prices_merge(fits: Mapping[str, PiecewiseLinearFit]) -> bool:
    """Whether a fit prices the merge term."""
    return any(DECODE_MERGE_SPLITS in fit.linear_features for fit in fits.values())


def _decode_only(features: Mapping[str, Any]) -> bool:
    return not features["num_prefill_tokens"] and bool(features["num_decode_tokens"])


def row_merge_splits(row: Mapping[str, Any], programs: DecodePrograms, decode_context: int) -> int:
    """A step table row's merge term, its contexts the grid's spread around their mean (module doc)."""
    if not _decode_only(row):
        return 0
    seqs = int(row["num_seqs"])
    lens = grid_spread_lens(seqs, float(row["decode_context_tokens"]) / max(seqs, 1)).tolist()
    return programs.merge_splits(lens, launch_graph(row, decode_context))


def merge_column(rows: Sequence[Mapping[str, Any]], programs: DecodePrograms, decode_context: int) -> list[int]:
    return [row_merge_splits(row, programs, decode_context) for row in rows]


def with_decode_merge(features: dict[str, float], plan: StepPlan, ahead: int, programs: DecodePrograms,
                      graphs: GraphSizes) -> dict[str, float]:
    """features, with the merge term of the step, its contexts `ahead` tokens longer than plan's."""
    merge = 0
    if _decode_only(features):
        merge = programs.merge_splits(plan_lens(plan, ahead), launch_graph(features, graphs.decode_context))
    features[DECODE_MERGE_SPLITS] = merge
    return features


def with_row_merge(features: Mapping[str, float], programs: DecodePrograms | None,
                   decode_context: int) -> Mapping[str, float]:
    """features with the merge term from the row's totals where they lack it (a table's row, a
    tool's own step); ValueError without the decode kernel's figures."""
    if DECODE_MERGE_SPLITS in features:
        return features
    if programs is None:
        raise ValueError(f"this profile prices {DECODE_MERGE_SPLITS}, which needs the decode kernel's figures "
                         "(hardware.num_sms, hardware.decode_program_bandwidth)")
    return {**features, DECODE_MERGE_SPLITS: row_merge_splits(features, programs, decode_context)}
