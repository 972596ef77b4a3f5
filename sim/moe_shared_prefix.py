"""How alike sequences over one prefix route: the shared-prefix routing's two figures, fitted.

Decodes over one prefix attend mostly the same KV, so on Qwen3-30B-A3B with random weights they
route far more alike than the tokens of one prompt do (experiments/fidelity/h100_30b_r4): 8 groups
of 4 decodes touched 55 experts per layer, about one fresh top-k per group (the tokens of one
prompt at the fitted locality 2.0 make 1.7 of 4), and a group of 128 or 256 decodes no more than
about five. sim.moe_groups prices a routing group by two figures: shared_fresh (the probability
that a later member's fresh draw is fresh for the group: the small groups' slope) and shared_cap
(how many routings of its own the group's later members choose among: the large groups' ceiling;
None: no bound).

fit_shared_routing fits both, as fit_routing_locality fits the locality: least squares of
log(predicted / observed) over steps whose distinct experts an engine counted, the skew and the
locality held at their own fits. shared_fresh 1 without a cap is every sequence routing on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from sim.moe_groups import MAX_CAP
from sim.moe_locality import SequenceRouting, golden_minimum, squared_log_error

# the grid the fit starts from: fresh log-spaced over [1e-3, 1], caps log-spaced integers over [1, MAX_CAP] and none
_FRESH = np.exp(np.linspace(math.log(1e-3), 0.0, 16))
_CAPS: tuple[int | None, ...] = (*sorted({round(x) for x in np.geomspace(1, MAX_CAP, 9)}), None)
_STEP = float(np.log(_FRESH[1] / _FRESH[0]))
_GOLDEN_STEPS = 18
_MOVES = 30  # steps from the grid's cap to a neighbour that fits better
_FINE_CAPS = 64  # caps past this are taken at the grid's spacing (a few percent apart)
_TOLERANCE = 1e-6  # ... by more than this squared log error (a count 0.1% closer in one step)

Steps = Sequence[Sequence[int | tuple[int, ...]]]


def fit_shared_routing(steps: Steps, observed: Sequence[float] | npt.ArrayLike, num_experts: int, top_k: int,
                       skew: float = 0.0, locality: float = 0.0) -> tuple[float, int | None]:
    """(shared_fresh, shared_cap) that best explain the distinct experts steps touched (module
    docstring): each cap of a log-spaced grid (and none) at the fresh that fits it best
    (golden-section search in log fresh), then a small best cap's integer neighbours likewise.

    steps: each step's routing sequences (sim.features.row_routing_sequences: a tuple of members per
    group); observed: the distinct experts per MoE layer each touched (moe_distinct_experts)."""
    counts = np.asarray(observed, dtype=np.float64)
    if len(steps) != len(counts) or not len(counts) or not np.all(np.isfinite(counts)) or np.any(counts <= 0):
        raise ValueError(f"fit_shared_routing needs one positive observed count per step, got {len(counts)} counts "
                         f"for {len(steps)} steps")
    if not any(not isinstance(g, (int, np.integer)) and len(g) > 1 for step in steps for g in step):
        raise ValueError("fit_shared_routing: no step has a routing group of two or more sequences")

    base = SequenceRouting(num_experts, top_k, skew, locality)
    base.distinct([max(max(g) if isinstance(g, tuple) else int(g) for step in steps for g in step)])  # its table, once

    def loss(fresh: float, cap: int | None) -> float:
        return squared_log_error(base.with_shared(min(fresh, 1.0), cap), steps, counts)

    def best_fresh(cap: int | None, around: float) -> tuple[float, float]:
        """(loss, fresh) at the fresh that fits best with this cap (golden section near `around`)."""
        low, high = math.log(around) - 2 * _STEP, min(math.log(around) + 2 * _STEP, 0.0)
        fresh = math.exp(golden_minimum(lambda x: loss(math.exp(x), cap), low, high, _GOLDEN_STEPS))
        return loss(fresh, cap), fresh

    # each cap of the grid at its best fresh (started from the fresh grid's best for it)
    start = {c: min(_FRESH, key=lambda f: loss(float(f), c)) for c in _CAPS}
    best, fresh, cap = min((best_fresh(c, float(start[c])) + (c,) for c in _CAPS), key=lambda t: t[0])
    for _ in range(_MOVES):  # then a finite cap's integer neighbours, while one fits better
        if cap is None or cap > _FINE_CAPS:
            break
        near = [c for c in (cap - 1, cap + 1) if c >= 1]
        tried = min((best_fresh(c, fresh) + (c,) for c in near), key=lambda t: t[0])
        if tried[0] > best - _TOLERANCE:
            break
        best, fresh, cap = tried
    return min(fresh, 1.0), cap
