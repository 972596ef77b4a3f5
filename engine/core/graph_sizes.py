"""Which steps replay a CUDA graph, and at what padded size: the one rule of both backends.

The engine captures a graph per size and runs a step as the graph of the smallest size that
holds it; the simulator prices a step as that padded graph. Both take their sizes from here.

Decode graphs (nano-vllm's sizes): batch sizes 1, 2, 4, 8, then every multiple of 16 up to the
largest graph batch, which is always included.
Prefill graphs: token counts, powers of two up to 512, where a step's cost is its launches and
weight reads whatever its size; then every 256 tokens, where compute grows with the tokens and
padding costs up to 256 / n.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.config import ExecutionConfig

PREFILL_GRAPH_STEP = 256


@dataclass(frozen=True)
class GraphSizes:
    """The steps a backend replays as CUDA graphs: decode-only steps of up to decode[-1] sequences
    (padded to the next of these batch sizes) and other steps of up to prefill[-1] tokens (padded
    to the next of these token counts). Empty: eager.

    decode_context: the longest context the decode graphs were captured for (engine.cuda_graph
    passes it to the decode kernel, whose split count a graph keeps: engine.core.decode_split);
    0 where it is not known (a run saved before it was recorded) or there are no decode graphs."""

    decode: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()
    decode_context: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", tuple(sorted(self.decode)))
        object.__setattr__(self, "prefill", tuple(sorted(self.prefill)))
        context = self.decode_context
        if isinstance(context, bool) or not isinstance(context, int) or context < 0:
            raise ValueError(f"GraphSizes.decode_context must be an int >= 0 (0: unknown), got {context!r}")
        if not self.decode:
            object.__setattr__(self, "decode_context", 0)

    def __bool__(self) -> bool:
        return bool(self.decode or self.prefill)


def decode_graph_sizes(max_num_seqs: int, max_graph_batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, 8, 16, 32, 48, ... up to min(max_num_seqs, max_graph_batch_size), always included
    (0: none)."""
    for name, value in (("max_num_seqs", max_num_seqs), ("max_graph_batch_size", max_graph_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    top = min(max_num_seqs, max_graph_batch_size)
    sizes = [s for s in (1, 2, 4, 8) if s <= top]
    sizes += range(16, top + 1, 16)
    if top and sizes[-1] != top:
        sizes.append(top)  # a cap between multiples of 16 is captured too
    return tuple(sizes)


def prefill_graph_sizes(max_tokens: int) -> tuple[int, ...]:
    """16, 32, ..., 512, 768, 1024, ... up to max_tokens, which is always included (0: none)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(f"max_tokens must be an int >= 0 (0: no prefill graphs), got {max_tokens!r}")
    sizes = [s for s in (16, 32, 64, 128, 256, 512) if s <= max_tokens]
    sizes += range(512 + PREFILL_GRAPH_STEP, max_tokens + 1, PREFILL_GRAPH_STEP)
    if max_tokens and (not sizes or sizes[-1] != max_tokens):
        sizes.append(max_tokens)
    return tuple(sizes)


def planned_graph_sizes(execution: ExecutionConfig, max_num_seqs: int, max_num_batched_tokens: int,
                        prefill_graphs: bool = True, max_model_len: int = 0) -> GraphSizes:
    """What a backend running with these settings captures: decode batches up to max_num_seqs and
    prefill steps up to execution.prefill_graph_tokens (capped by the token budget); none when
    eager. prefill_graphs False: the attention backend cannot replay prefill steps. max_model_len:
    the scheduler's, which the engine captures its decode graphs for (0: not known)."""
    if execution.enforce_eager:
        return GraphSizes()
    decode = decode_graph_sizes(max_num_seqs, execution.max_graph_batch_size)
    prefill_tokens = min(execution.prefill_graph_tokens, max_num_batched_tokens) if prefill_graphs else 0
    return GraphSizes(decode, prefill_graph_sizes(prefill_tokens), max_model_len)


def padded_size(sizes: Sequence[int], n: int) -> int | None:
    """The smallest of the sorted sizes that holds n, None when none does."""
    if not sizes or n > sizes[-1]:
        return None
    return sizes[bisect_left(sizes, n)]
