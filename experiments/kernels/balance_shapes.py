"""The decode_balance probe's batches of contexts (no GPU imports: experiments.kernels.program_rate
reads the probe's results on a CPU)."""

from __future__ import annotations

import numpy as np

MEAN_CONTEXT = 1000
LONG_CONTEXT = 3700  # the "tail" batches' long sequences


def contexts(kind: str, batch: int, rng: np.random.Generator) -> list[int]:
    """Context lengths with mean MEAN_CONTEXT: even, uniform ragged, or a few long ones."""
    if kind == "even":
        return [MEAN_CONTEXT] * batch
    if kind == "ragged":
        return [int(c) for c in rng.integers(100, 2 * MEAN_CONTEXT - 100 + 1, size=batch)]
    long = max(1, batch // 10)  # "tail": a tenth of the batch at LONG_CONTEXT, the rest shorter
    short = (MEAN_CONTEXT * batch - LONG_CONTEXT * long) // (batch - long) if batch > long else MEAN_CONTEXT
    return [LONG_CONTEXT] * long + [max(16, short)] * (batch - long)
