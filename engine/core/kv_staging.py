"""The receive staging of a disaggregated engine replica's KV link, as blocks of its cache's layout.

A request's KV arrives over the link into one contiguous buffer (a point-to-point receive cannot
write into the paged cache's scattered blocks), and is copied into the cache when it landed.
Unbounded, those buffers grow with the transfers in flight: a decode replica fed by several
prefill replicas reserves cache blocks for every request it has room for, posts their receives at
once, and their buffers together can be as large as the free cache (on 4 x H200, one decode
replica fed by three prefill replicas ran out of memory at gpu_memory_utilization=0.9). So the
staging is a fixed budget, part of the replica's memory plan before the KV cache is sized
(engine.kv_sizing.MemoryProfile.staging_bytes):

- a decode replica keeps, for each prefill peer, a ring of STAGED_REQUESTS_PER_PEER full-length
  requests' blocks (StagingRing); a receive is posted only once its peer's ring has room, else
  the request waits for blocks as it would for cache room (back-pressure to the prefill replica,
  which keeps holding the blocks);
- a prefill replica's send copies are bounded by its decode peers' rings (it sends only what a
  decode replica posted a receive for), so it reserves the same amount per decode peer.

Between replicas of two TP sizes a piece that is not a rank's whole shard moves through one more
buffer of at most the request's size on each side (engine.kv_link), hence `copies`.
"""

from __future__ import annotations

from collections import deque

# Two in flight from each peer: one landing while the peer's next is on the wire.
STAGED_REQUESTS_PER_PEER = 2


def staging_blocks_per_peer(max_blocks_per_seq: int, copies: int = 1) -> int:
    """Blocks of staging one peer's transfers may occupy at once: STAGED_REQUESTS_PER_PEER
    requests of max_model_len, times the buffers a request needs on this side (copies)."""
    if max_blocks_per_seq < 1 or copies < 1:
        raise ValueError(f"max_blocks_per_seq and copies must be >= 1, got {max_blocks_per_seq} and {copies}")
    return STAGED_REQUESTS_PER_PEER * max_blocks_per_seq * copies


def link_staging_blocks(role: str | None, rank: int, num_prefill: int, tps: tuple[int, ...],
                        max_blocks_per_seq: int) -> int:
    """The staging a replica of a disaggregated fleet reserves in its memory plan, in blocks of its
    own cache layout: its peers in the other pool times each peer's budget (doubled for a peer of
    another TP size). role None (an aggregated replica): 0."""
    if role is None:
        return 0
    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
    peers = range(num_prefill, len(tps)) if role == "prefill" else range(num_prefill)
    return sum(staging_blocks_per_peer(max_blocks_per_seq, 1 if tps[p] == tps[rank] else 2) for p in peers)


class StagingRing:
    """First-in first-out ranges of blocks in a buffer of `capacity` blocks: take(n) places a
    contiguous range after the newest one (wrapping to the start when the end has no room),
    release() frees the oldest. A decode replica lands a peer's transfers in the order it posted
    them, so FIFO frees exactly what it used; any n <= capacity fits once the ring is empty."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"StagingRing capacity must be >= 1 block, got {capacity}")
        self.capacity = capacity
        self.live: deque[tuple[int, int]] = deque()  # (start, blocks), oldest first
        self.head = 0  # where the next range would start without wrapping

    @property
    def in_use(self) -> int:
        return sum(n for _, n in self.live)

    def place(self, n: int) -> int | None:
        """Where a range of n blocks would start now; None while it does not fit."""
        if not 1 <= n <= self.capacity:
            raise ValueError(f"a staged transfer needs 1..{self.capacity} blocks, got {n}")
        if not self.live:
            return 0
        tail = self.live[0][0]
        if self.head > tail:  # used [tail, head): free at the end, then before tail
            if self.head + n <= self.capacity:
                return self.head
            return 0 if n <= tail else None
        return self.head if self.head + n <= tail else None  # wrapped: free [head, tail)

    def fits(self, n: int) -> bool:
        return self.place(n) is not None

    def take(self, n: int) -> int:
        start = self.place(n)
        if start is None:
            raise ValueError(f"{n} blocks do not fit the staging ring now ({self.in_use} of {self.capacity} in use)")
        self.live.append((start, n))
        self.head = start + n
        return start

    def release(self) -> tuple[int, int]:
        """Free the oldest range; returns it."""
        if not self.live:
            raise ValueError("release() on an empty staging ring")
        oldest = self.live.popleft()
        if not self.live:
            self.head = 0
        return oldest


class FleetStaging:
    """A simulated disaggregated fleet's receive staging: for each (decode replica, prefill replica)
    pair, a StagingRing and the ids of the requests staged in it, oldest first. A range is freed
    only once it and every earlier transfer from that peer landed (the engine scatters receives in
    the order it posted them), so a request landing behind one still in transit waits in `landed`."""

    def __init__(self) -> None:
        self.rings: dict[tuple[int, int], StagingRing] = {}
        self.staged: dict[tuple[int, int], deque[str]] = {}
        self.landed: set[str] = set()

    def ring(self, key: tuple[int, int], max_blocks_per_seq: int) -> StagingRing:
        """The ring of pair `key`, made on first use for a replica of max_blocks_per_seq blocks a sequence."""
        ring = self.rings.get(key)
        if ring is None:
            ring = self.rings[key] = StagingRing(staging_blocks_per_peer(max_blocks_per_seq))
            self.staged[key] = deque()
        return ring

    def stage(self, key: tuple[int, int], request_id: str, num_blocks: int) -> None:
        """Take num_blocks of pair `key`'s ring (made by ring()) for the request's transfer."""
        self.rings[key].take(num_blocks)
        self.staged[key].append(request_id)

    def land(self, key: tuple[int, int], request_id: str) -> None:
        """The request's KV landed: free the ring's oldest ranges whose transfers all landed."""
        staged = self.staged[key]
        self.landed.add(request_id)
        while staged and staged[0] in self.landed:
            self.landed.remove(staged.popleft())
            self.rings[key].release()
