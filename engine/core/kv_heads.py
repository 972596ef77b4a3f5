"""Which KV heads a tensor-parallel rank holds, and how a request's KV is regrouped when it moves
between replicas of two TP sizes (engine.kv_link moves it; sim.kv_transfer prices it).

A rank of a TP group of size tp holds num_kv_heads / tp consecutive KV heads; with more ranks
than KV heads, each rank holds one head, replicated on tp / num_kv_heads consecutive ranks (as
engine.layers.linear.QKVParallelLinear shards the k and v projections).

The plan sends every head each destination rank holds exactly once, from one source rank that
holds it. A head held by several source ranks (replicated) comes from the one at the destination
rank's position among them, so equal TP sizes pair every rank with itself and replicas share
the sending. A source rank and a destination rank hold consecutive heads, so what one sends the
other is one consecutive range: a piece.
"""

from __future__ import annotations

from dataclasses import dataclass


def check_kv_split(num_kv_heads: int, tp: int) -> None:
    """ValueError unless tp divides num_kv_heads or is a multiple of it."""
    if num_kv_heads < 1 or tp < 1 or (num_kv_heads % tp and tp % num_kv_heads):
        raise ValueError(f"tensor_parallel_size={tp} must divide or be a multiple of "
                         f"num_key_value_heads={num_kv_heads}")


def kv_heads_held(num_kv_heads: int, tp: int, rank: int) -> range:
    """The KV heads (model numbering) rank `rank` of a TP group of size tp holds."""
    check_kv_split(num_kv_heads, tp)
    if not 0 <= rank < tp:
        raise ValueError(f"TP rank {rank} is not in 0..{tp - 1}")
    if num_kv_heads >= tp:
        per = num_kv_heads // tp
        return range(rank * per, (rank + 1) * per)
    head = rank // (tp // num_kv_heads)
    return range(head, head + 1)


@dataclass(frozen=True)
class HeadPiece:
    """KV heads first..first+count-1 (model numbering), sent by TP rank src of the sending replica
    to TP rank dst of the receiving one."""

    src: int
    dst: int
    first: int
    count: int

    def local(self, num_kv_heads: int, tp: int, rank: int) -> slice:
        """The piece's heads in the cache of rank `rank` of a TP group of size tp (src or dst)."""
        start = self.first - kv_heads_held(num_kv_heads, tp, rank).start
        return slice(start, start + self.count)


def reshard_plan(num_kv_heads: int, src_tp: int, dst_tp: int) -> tuple[HeadPiece, ...]:
    """The pieces that move a request's KV from a replica of TP size src_tp to one of dst_tp,
    ordered by destination rank then source rank."""
    holders: dict[int, list[int]] = {}
    for rank in range(src_tp):
        for head in kv_heads_held(num_kv_heads, src_tp, rank):
            holders.setdefault(head, []).append(rank)
    pieces: list[HeadPiece] = []
    for dst in range(dst_tp):
        chosen: dict[int, list[int]] = {}
        for head in kv_heads_held(num_kv_heads, dst_tp, dst):
            ranks = holders[head]
            chosen.setdefault(ranks[dst % len(ranks)], []).append(head)
        for src in sorted(chosen):
            heads = chosen[src]
            pieces.append(HeadPiece(src, dst, heads[0], len(heads)))
    return tuple(pieces)


def busiest_rank_heads(plan: tuple[HeadPiece, ...]) -> int:
    """The most heads one GPU sends or receives under the plan: the share of the transfer that
    sets its time when every GPU has a link of its own."""
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for piece in plan:
        sent[piece.src] = sent.get(piece.src, 0) + piece.count
        received[piece.dst] = received.get(piece.dst, 0) + piece.count
    return max(max(sent.values()), max(received.values()))
