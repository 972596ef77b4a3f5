"""The token counts the engine captures prefill steps at, shared with the simulator: a step of n
tokens runs as the graph of the smallest size >= n, so both sides must pad alike.

Powers of two up to 512, where a step's cost is its launches and weight reads whatever its size;
then every 256 tokens, where compute grows with the tokens and padding costs up to 256 / n.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

PREFILL_GRAPH_STEP = 256


def prefill_graph_sizes(max_tokens: int) -> tuple[int, ...]:
    """16, 32, ..., 512, 768, 1024, ... up to max_tokens, which is always included (0: none)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0 (0: no prefill graphs), got {max_tokens!r}")
    sizes = [s for s in (16, 32, 64, 128, 256, 512) if s <= max_tokens]
    sizes += range(512 + PREFILL_GRAPH_STEP, max_tokens + 1, PREFILL_GRAPH_STEP)
    if max_tokens and (not sizes or sizes[-1] != max_tokens):
        sizes.append(max_tokens)
    return tuple(sizes)


def padded_size(sizes: Sequence[int], n: int) -> int | None:
    """The smallest of the sorted sizes that holds n, None when none does."""
    if not sizes or n > sizes[-1]:
        return None
    return sizes[bisect_left(sizes, n)]
