"""The distinct experts each profiled step's tokens really touched (a mixture-of-experts model whose
engine records its routing: backend.record_expert_counts, engine.expert_counts).

The engine's counter adds every real token's (token, expert) choices per MoE layer on the device;
ExpertTally reads it back once per profiled shape, outside the timed region (one device sync and a
[MoE layers, experts] copy), and turns it into the shape's moe_distinct_experts: the experts with a
nonzero count, per layer, averaged over the layers. A shape's executions (warm-up, repeats, the
overlap probes) run the same plan on the same token ids and the same KV blocks, so they route
alike and the union over them is the step's own count.

Why a measured count: the expected count of a shape's token number (sim.moe.ExpertRouting) is a
function of its size alone, so the profiled fit cannot tell an expert's price from the size's
(sim.piecewise.collinear). Measured counts differ from that expectation (sequences over one
shared prefix, or one prompt's tokens, route alike on random weights), so the fit can price an
expert as a feature of its own; the simulator still prices its steps by the expectation.

The tally also keeps the sum of every shape's counts, which the routing-skew fit reads
(harness.fidelity.routing.measured_skew) as it read the counter before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np


def distinct_per_layer(tokens: np.ndarray) -> float:
    """Mean over MoE layers of the experts with at least one routed token; tokens [layers, experts]."""
    return float((np.asarray(tokens) > 0).sum(axis=1).mean())


class ExpertTally:
    """Per-shape distinct experts and the running sum of an engine's expert counts (module docstring)."""

    def __init__(self, take: Callable[[], Any], start: Any) -> None:
        self._take = take
        self._total = start  # an engine.expert_counts.ExpertCounts

    @classmethod
    def of(cls, executor: object) -> ExpertTally | None:
        """A tally of the executor's counter, None where it records none (a dense model, recording
        off, a simulated executor). What the counter holds now (start-up's steps) is dropped."""
        take = getattr(executor, "take_expert_counts", None)
        start = take() if take is not None else None
        if take is None or start is None:
            return None
        return cls(take, dataclasses.replace(start, tokens=np.zeros_like(start.tokens)))

    def begin(self) -> None:
        """Before a shape: what ran since the last take() goes to the total only."""
        self._add(self._take())

    def distinct(self) -> float:
        """The shape's distinct experts per MoE layer: the counts since begin()."""
        counts = self._add(self._take())
        return distinct_per_layer(counts.tokens)

    @property
    def total(self) -> Any:
        """Every count taken so far (an engine.expert_counts.ExpertCounts)."""
        return self._total

    def _add(self, counts: Any) -> Any:
        self._total = dataclasses.replace(self._total, tokens=self._total.tokens + counts.tokens)
        return counts
