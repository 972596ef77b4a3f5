"""Step features: the one description of a step shared by the profiler and the profiled cost model.

The engine's profiler writes step_features(plan) plus the measured duration_s for each step it
runs; ProfiledCostModel fits durations on those columns and predicts a simulated step from the
same function, so a measured step and a predicted step are described identically.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from engine.core.graph_sizes import GraphSizes, padded_size
from engine.core.plan import StepPlan

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# The repeated-read columns: each a share of the step's KV reads that a GPU serves from L2
# (sim.repeated_reads prices them).
REPEATED_FEATURES = ("decode_repeated_tokens", "prefill_repeated_tokens")
FEATURE_COLUMNS = (
    "num_prefill_tokens",       # new tokens of prefill chunks
    "num_decode_tokens",        # decode entries (one token each)
    "num_tokens",               # both of the above
    "num_seqs",                 # scheduled requests
    "num_sampled",              # rows that go through the LM head
    "num_seeded",               # of those, rows sampled with a per-request seed (the sampler draws their noise
                                # from a generator of their own: a fixed host cost per row)
    "prefill_context_tokens",   # tokens already cached before each prefill chunk (prefix hits, earlier chunks)
    "prefill_attention_pairs",  # causal (query, key) pairs of prefill chunks: sum n*c + n(n+1)/2
    "decode_context_tokens",    # KV tokens read by decodes, their own new token included
    "decode_repeated_tokens",   # of those, tokens of blocks another decode of the step reads too, counted once
                                # per read after the first (a shared prefix: engine.core.kv_reads)
    "prefill_repeated_tokens",  # the step's other repeated reads: a prefill chunk's context blocks that
                                # another sequence of the step reads too
    "cuda_graph",               # 1 if the step runs as a captured CUDA graph (engine.core.graph_sizes)
    "graph_batch_size",         # the rows the GPU really runs: under a graph, padded to its captured size
                                # (sequences of a decode step, tokens of a prefill or mixed step)
)

# A mixture-of-experts model's column (sim.moe): distinct experts per MoE layer that the step's
# tokens touch: their weights are what its decode steps read. Written only for MoE models, so a
# dense model's rows, profiles and fits are as they were.
MOE_FEATURES = ("moe_distinct_experts",)
# Beside a profile's measured counts (harness.calibration.expert_steps): the expectation of each
# row's token count, what a simulated step of its shape is priced with. Not fitted.
EXPECTED_EXPERTS = "moe_expected_experts"
# A step's routing sequences: each a sequence's new tokens (an int; a decode: 1), or a routing
# group's, the new tokens of each of its members (a tuple: sequences over one prefix,
# routing_sequences; sim.moe_locality prices a group by its members).
Routed = int | tuple[int, ...]
# How many distinct experts a step touches per MoE layer, from its routing sequences:
# sim.moe_locality.SequenceRouting.distinct (an expectation), or a count the engine observed.
DistinctExperts = Callable[[Sequence[Routed]], float]
# A CUDA graph's padding rows (engine.cuda_graph, engine.prefill_graphs: token 0 at position 0, no
# context, so every one has the same hidden states) go through the MoE layers too, and their router
# gives them all one top-k: the grouped GEMM reads those experts' weights like any token's. To the
# weights a padded step reads they are one more sequence of one token; the engine's expert counter
# leaves them out (engine.expert_counts), so a measured count is of the real tokens alone.
PADDING_SEQUENCE = 1
# Beside an MoE profile's measured counts: how many routing groups the step's sequences form, those
# over one prefix counting as one (routing_sequences). Not fitted; it lets a table row be priced
# with shared-prefix routing (row_routing_sequences).
ROUTING_GROUPS = "moe_routing_groups"


def routing_sequences(plan: StepPlan) -> list[tuple[int, ...]]:
    """The step's routing groups, each the new tokens of its members: scheduled entries that start
    with the same tokens (equal prefix_key: the prefix cache's hash of their first block) or, where
    an entry has no key (the profiling grid's plans), with the same physical block (a prefix-cache
    hit shares a prompt's blocks from its first) form one group; an entry with neither is a group of
    its own."""
    groups: dict[tuple[str, int], list[int]] = {}
    alone: list[tuple[int, ...]] = []
    for entry in plan.scheduled:
        n = len(entry.token_ids)
        if entry.prefix_key is not None:
            groups.setdefault(("tokens", entry.prefix_key), []).append(n)
        elif entry.block_table:
            groups.setdefault(("block", entry.block_table[0]), []).append(n)
        else:
            alone.append((n,))
    return [tuple(members) for members in groups.values()] + alone


def row_routing_sequences(prefill_tokens: int, decode_tokens: int, num_seqs: int,
                          groups: int) -> list[tuple[int, ...]]:
    """A table row's routing groups (routing_sequences), from its totals and its number of routing
    groups: exact for the profiling grid's shapes (chunks evened as row_sequences has them; decodes
    over one or more prefixes, round robin; chunks over one prefix; a chunk of its own beside
    decodes over one prefix), an evening-out for a served step's. Groups that leave the prefill
    chunks apart (groups > chunks) hold the decodes, round robin; fewer hold the chunks round robin
    and the decodes round robin beside them."""
    sizes = row_sequences(prefill_tokens, decode_tokens, num_seqs)
    groups = min(max(int(groups), 1), len(sizes)) if sizes else 0
    if groups >= len(sizes):
        return [(n,) for n in sizes]
    decodes = int(decode_tokens)
    chunks = sizes[:len(sizes) - decodes]
    if groups > len(chunks) and decodes:
        held = groups - len(chunks)
        return [(n,) for n in chunks] + [(1,) * (decodes // held + (i < decodes % held)) for i in range(held)]
    merged: list[list[int]] = [[] for _ in range(groups)]
    for i, n in enumerate(chunks):
        merged[i % groups].append(n)
    for i in range(decodes):
        merged[i % groups].append(1)
    return [tuple(members) for members in merged]


def graph_padded(cuda_graph: float, graph_batch_size: float, num_tokens: float) -> bool:
    """Whether a step runs padding rows: a CUDA graph larger than its tokens (a decode graph's size
    counts sequences of one token each, a prefill graph's tokens)."""
    return bool(cuda_graph) and graph_batch_size > num_tokens


def read_sequences(sizes: Sequence[Routed], padded: bool) -> list[Routed]:
    """The routing sequences whose experts a step's MoE layers read: its own, plus the padding rows
    as one more of PADDING_SEQUENCE token where the step is padded (graph_padded)."""
    return [*sizes, PADDING_SEQUENCE] if padded else list(sizes)


def row_read_sequences(row: Mapping[str, float], shared_prefix: bool = False) -> list[Routed]:
    """read_sequences of a step table row (its totals: row_sequences, or with shared_prefix and the
    row's ROUTING_GROUPS, row_routing_sequences); a row without graph columns runs unpadded."""
    totals = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"]), int(row["num_seqs"])
    sizes: list[Routed] = [*row_routing_sequences(*totals, int(row[ROUTING_GROUPS]))] if shared_prefix \
        else [*row_sequences(*totals)]
    padded = graph_padded(row.get("cuda_graph", 0), row.get("graph_batch_size", 0), totals[0] + totals[1])
    return read_sequences(sizes, padded)


def row_sequences(prefill_tokens: int, decode_tokens: int, num_seqs: int) -> list[int]:
    """A step table row's new tokens per sequence, where the table keeps only totals: its
    num_seqs - decode_tokens prefill chunks share prefill_tokens equally (as the profiling grid's
    prefill shapes do; a served or random step's ragged chunks are evened out), then one token
    per decode."""
    chunks = max(int(num_seqs) - int(decode_tokens), 0)
    if chunks == 0:
        return [1] * int(decode_tokens) + ([int(prefill_tokens)] if prefill_tokens > 0 else [])
    size, extra = divmod(int(prefill_tokens), chunks)
    return [size + (i < extra) for i in range(chunks)] + [1] * int(decode_tokens)


def as_graph_sizes(sizes: GraphSizes | Sequence[int]) -> GraphSizes:
    """GraphSizes as given, or from a plain sequence of decode batch sizes (no prefill graphs)."""
    return sizes if isinstance(sizes, GraphSizes) else GraphSizes(decode=tuple(sizes))


# token counts: ints, or numpy arrays (and pandas columns, untyped here) of them elementwise
Counts = TypeVar("Counts", int, "npt.NDArray[np.int64]")


def attention_pairs(new_tokens: Counts, cached_tokens: Counts) -> Counts:
    """Causal (query, key) pairs of a chunk of new_tokens after cached_tokens already in the cache:
    query j (0-based) sees cached + j + 1 keys, so the chunk reads n*c + n(n+1)/2 keys in all,
    quadratic in the context. Works on ints and, elementwise, on numpy arrays / pandas columns.
    The one place this formula lives: the roofline's attention FLOPs, the profiled model's
    attention feature and the profiler's rows all take it from here."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


def decode_attention_pairs(context_tokens: Counts, num_decodes: Counts) -> Counts:
    """attention_pairs(1, c) summed over num_decodes decodes whose cached contexts sum to
    context_tokens (each new token sees its context and itself)."""
    return context_tokens + num_decodes


def step_features(plan: StepPlan, graphs: GraphSizes | Sequence[int] = (),
                  distinct_experts: DistinctExperts | None = None, shared_prefix: bool = False) -> dict[str, float]:
    """Describe a step by FEATURE_COLUMNS, and MOE_FEATURES where distinct_experts is given (an
    MoE model: distinct_experts(new tokens of each scheduled sequence), or with shared_prefix of
    each routing sequence: routing_sequences; with a graph's padding rows where it has them:
    read_sequences).

    graphs: what the engine captured (GraphSizes; a plain sequence: decode batch sizes only;
    empty when running eager). A decode-only step whose batch fits the largest decode graph runs
    as the graph of the next size up; another step whose tokens fit the largest prefill graph
    likewise. A plan with use_cuda_graphs False runs eager whatever its size.
    """
    graphs = as_graph_sizes(graphs) if plan.use_cuda_graphs else GraphSizes()
    prefill_tokens = decode = sampled = seeded = prefill_context = pairs = decode_context = 0
    sizes: list[int] = []
    for entry in plan.scheduled:
        n = len(entry.token_ids)
        c = entry.num_computed_tokens
        sizes.append(n)
        if entry.is_decode:
            decode += 1
            decode_context += c + n
        else:
            prefill_tokens += n
            prefill_context += c
            pairs += attention_pairs(n, c)
        if entry.sample:
            sampled += 1
            params = entry.sampling_params
            if params.seed is not None and params.temperature != 0.0:
                seeded += 1
    num_seqs = len(plan.scheduled)
    graph = 0
    batch = num_seqs
    if not prefill_tokens and graphs.decode and num_seqs <= graphs.decode[-1]:
        graph = 1
        batch = graphs.decode[bisect_left(graphs.decode, num_seqs)]
    elif prefill_tokens and (padded := padded_size(graphs.prefill, prefill_tokens + decode)) is not None:
        graph = 1
        batch = padded
    stats = plan.stats
    features: dict[str, float] = {
        "num_prefill_tokens": prefill_tokens,
        "num_decode_tokens": decode,
        "num_tokens": prefill_tokens + decode,
        "num_seqs": num_seqs,
        "num_sampled": sampled,
        "num_seeded": seeded,
        "prefill_context_tokens": prefill_context,
        "prefill_attention_pairs": pairs,
        "decode_context_tokens": decode_context,
        "decode_repeated_tokens": stats.decode_repeated_kv_tokens,
        "prefill_repeated_tokens": stats.repeated_kv_tokens - stats.decode_repeated_kv_tokens,
        "cuda_graph": graph,
        "graph_batch_size": batch,
    }
    if distinct_experts is not None:
        own: list[Routed] = [*routing_sequences(plan)] if shared_prefix else [*sizes]
        padded = graph_padded(graph, batch, prefill_tokens + decode)
        features["moe_distinct_experts"] = distinct_experts(read_sequences(own, padded))
    return features
