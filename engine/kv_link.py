"""The KV link of a disaggregated engine fleet: one process group over its replicas (prefill
replicas rank 0..P-1, decode replicas P..P+D-1), and the moves of a request's KV blocks over it.

The group is a torch.distributed ProcessGroup built on its own TCPStore (NCCL between GPUs, gloo
on CPU), not the default group: a replica's default group is its tensor-parallel group
(engine.tp.group), and this one must live beside it. Blocks move with point-to-point send/recv;
torch matches the sends of one source with the receives posted for it in order, so each side
posts them in the order the router ordered the transfers (engine.core.disagg_wall).

A request's blocks on one TP rank are one tensor [num_layers, 2, num_blocks_of_request,
block_size, kv_heads, head_dim]: the runner's cache (engine.runner: [num_layers, 2, num_blocks,
block_size, kv_heads, head_dim]) indexed by the request's block table along dim 2. Between
replicas of two TP sizes the KV heads are regrouped (engine.core.kv_heads.reshard_plan): each
source rank sends each destination rank the consecutive heads it owes it, one message a piece,
and a destination rank puts its pieces side by side along the head dimension.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from engine.core.disagg_wall import LinkSpec
from engine.core.kv_heads import HeadPiece, reshard_plan
from engine.core.kv_staging import StagingRing, staging_blocks_per_peer
from engine.tp.group import apply_safe_env


class Move:
    """One request's KV to or from one peer replica: a point-to-point work a piece, with the
    tensors it reads or fills (kept alive until it completes), and for a received piece that is
    not the whole shard, the part of the staging tensor it goes into. Waits and polls like a
    torch.distributed work."""

    def __init__(self) -> None:
        self.parts: list[tuple[Any, torch.Tensor, torch.Tensor | None]] = []
        self.done = False

    def is_completed(self) -> bool:
        return all(work.is_completed() for work, _, _ in self.parts)

    def wait(self) -> None:
        """Once (a gloo work waited on twice never returns): every piece, then each into place
        (queued on the current stream, which the wait ordered after the receive)."""
        if self.done:
            return
        for work, buffer, target in self.parts:
            work.wait()
            if target is not None:
                target.copy_(buffer)
        self.done = True


class KVLink:
    """This process's end of the link. Peers are named by replica index; which TP ranks of the
    peer this rank exchanges which KV heads with is the head plan's (LinkSpec)."""

    def __init__(self, spec: LinkSpec, device: torch.device, num_kv_heads: int) -> None:
        apply_safe_env()
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        rank, size = spec.link_rank(spec.rank, spec.tp_rank), spec.world_size
        self.store = dist.TCPStore("127.0.0.1", spec.port, size, is_master=rank == 0, timeout=timeout)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, size, options)
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, size, timeout=timeout)
        self.spec, self.device, self.num_kv_heads = spec, device, num_kv_heads
        self.rank, self.replicas = spec.rank, spec.size
        self.tp, self.tp_rank = spec.tp, spec.tp_rank
        self._plans: dict[tuple[int, int], tuple[HeadPiece, ...]] = {}
        self.staging: StagingPool | None = None  # a decode replica's receive buffers (stage())

    def stage(self, kv_cache: torch.Tensor, num_prefill: int, max_blocks_per_seq: int) -> None:
        """On a decode replica, allocate the receive staging its memory plan kept room for
        (engine.core.kv_staging): a ring per prefill peer. Nothing on a prefill replica."""
        if self.rank >= num_prefill:
            self.staging = StagingPool(kv_cache, num_prefill, staging_blocks_per_peer(max_blocks_per_seq))

    def plan(self, src: int, dst: int) -> tuple[HeadPiece, ...]:
        """The pieces that move a request from replica src to replica dst, between all their ranks."""
        key = (self.spec.tp_of(src), self.spec.tp_of(dst))
        if key not in self._plans:
            self._plans[key] = reshard_plan(self.num_kv_heads, *key)
        return self._plans[key]

    def sends_to(self, dst: int) -> list[HeadPiece]:
        return [p for p in self.plan(self.rank, dst) if p.src == self.tp_rank]

    def receives_from(self, src: int) -> list[HeadPiece]:
        return [p for p in self.plan(src, self.rank) if p.dst == self.tp_rank]

    def request_bytes(self, blocks: torch.Tensor, dst: int) -> int:
        """Bytes a request moves to replica dst over all ranks, from this rank's blocks of it
        (heads replicated on several decode ranks counted for each)."""
        per_head = blocks.numel() // blocks.shape[-2] * blocks.element_size()
        return per_head * sum(p.count for p in self.plan(self.rank, dst))

    def warm_up(self, num_prefill: int) -> None:
        """One small message along every pair of ranks the plans use between prefill and decode
        replicas, so that no request's transfer pays for setting up a pair's connection (NCCL
        makes one per pair on first use, blocking both). Both sides go through their peers in
        link rank order, so no two pairs wait on each other."""
        sending = self.rank < num_prefill
        if sending:
            peers = [(dst, p.dst) for dst in range(num_prefill, self.replicas) for p in self.sends_to(dst)]
        else:
            peers = [(src, p.src) for src in range(num_prefill) for p in self.receives_from(src)]
        works = []
        for replica, tp_rank in peers:
            token = torch.zeros(1, device=self.device)
            peer = self.spec.link_rank(replica, tp_rank)
            works.append((self.group.send([token], peer, 0) if sending else self.group.recv([token], peer, 0), token))
        for work, _ in works:
            work.wait()

    def completed(self, work) -> bool:
        """Whether a send or receive is done; call it until True, then not again (a gloo work
        waited on twice never returns). True also orders this stream after the transfer, and
        raises the transfer's error if it failed. NOTE: gloo's point-to-point work only learns it
        is done in wait(), so on CPU this waits (the peer has posted its half or is about to: the
        router told it at the same time); NCCL's is polled."""
        if self.device.type == "cuda" and not work.is_completed():
            return False
        work.wait()
        return True

    def send(self, blocks: torch.Tensor, dst: int) -> Move:
        """Start sending this rank's blocks of a request to replica dst: each piece the plan has
        this rank send (the Move keeps the tensors alive until it completes)."""
        move = Move()
        for piece in self.sends_to(dst):
            heads = piece.local(self.num_kv_heads, self.tp, self.tp_rank)
            part = blocks if heads == slice(0, blocks.shape[-2]) else blocks[..., heads, :].contiguous()
            peer = self.spec.link_rank(dst, piece.dst)
            move.parts.append((self.group.send([part], peer, 0), part, None))
        return move

    def recv(self, staging: torch.Tensor, src: int) -> Move:
        """Start receiving this rank's blocks of a request from replica src into `staging`
        (StagingPool.take or staging_for: this rank's layout); staging is whole once the Move completed."""
        move = Move()
        for piece in self.receives_from(src):
            heads = piece.local(self.num_kv_heads, self.tp, self.tp_rank)
            target = None if heads == slice(0, staging.shape[-2]) else staging[..., heads, :]
            buffer = staging if target is None else torch.empty_like(target, memory_format=torch.contiguous_format)
            peer = self.spec.link_rank(src, piece.src)
            move.parts.append((self.group.recv([buffer], peer, 0), buffer, target))
        return move


def block_index(block_table: list[int], device: torch.device) -> torch.Tensor:
    """The block ids on the cache's device. On a GPU they go up from pinned host memory without
    blocking: a pageable copy would wait for the step in flight on the current stream (the
    host-side cost of a transfer that this module exists to avoid)."""
    index = torch.tensor(block_table, dtype=torch.long, pin_memory=device.type == "cuda")
    return index.to(device, non_blocking=True)


class BlockMover:
    """Gathers a request's blocks for a send, and scatters received ones into the cache, without
    the host waiting on the device. On a GPU the gather runs on a side stream after the steps
    queued so far (whose KV it copies), and the device's later steps wait for it (they may reuse
    the blocks once the copy is taken): the send is issued on the side stream, so it waits for
    the gather and never for a step. The scatter runs on the current stream, after the receive
    (KVLink.completed orders the stream after it) and before the next step that reads the
    request. On CPU both are plain copies."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def gather(self, kv_cache: torch.Tensor, block_table: list[int]) -> torch.Tensor:
        """A copy of the request's blocks: [num_layers, 2, len(block_table), block_size, kv_heads, head_dim]."""
        if self.side is None:
            return read_blocks(kv_cache, block_table)
        main = torch.cuda.current_stream(self.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            blocks = kv_cache.index_select(2, block_index(block_table, self.device))
        main.wait_stream(self.side)
        return blocks

    def send(self, link: KVLink, blocks: torch.Tensor, dst: int) -> Move:
        """Start sending gathered blocks: after the gather, on its stream (the caller keeps blocks
        alive until the move completes; the pieces it cuts out of them live in the move)."""
        if self.side is None:
            return link.send(blocks, dst)
        with torch.cuda.stream(self.side):
            return link.send(blocks, dst)

    def scatter(self, kv_cache: torch.Tensor, block_table: list[int], blocks: torch.Tensor) -> None:
        write_blocks(kv_cache, block_table, blocks)


def read_blocks(kv_cache: torch.Tensor, block_table: list[int]) -> torch.Tensor:
    """A copy of the request's blocks: [num_layers, 2, len(block_table), block_size, kv_heads, head_dim]."""
    return kv_cache.index_select(2, block_index(block_table, kv_cache.device))


def staging_for(kv_cache: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A receive buffer for num_blocks blocks of this cache's layout, outside any StagingPool."""
    shape = (kv_cache.shape[0], 2, num_blocks, *kv_cache.shape[3:])
    return torch.empty(shape, dtype=kv_cache.dtype, device=kv_cache.device)


class StagingPool:
    """A decode replica's receive buffers: one allocation, cut into a StagingRing of
    blocks_per_peer blocks for each prefill peer. take() hands out a request's contiguous buffer
    in the cache's layout ([num_layers, 2, n, block_size, kv_heads, head_dim]); release(peer)
    frees that peer's oldest, so a peer's transfers must land in the order they were taken."""

    def __init__(self, kv_cache: torch.Tensor, peers: int, blocks_per_peer: int) -> None:
        self.block_shape = (kv_cache.shape[0], 2, *kv_cache.shape[3:])
        self.block_elems = kv_cache.shape[0] * 2 * kv_cache[0, 0, 0].numel()
        self.blocks_per_peer = blocks_per_peer
        self.rings = [StagingRing(blocks_per_peer) for _ in range(peers)]
        self.buffer = torch.empty(peers * blocks_per_peer * self.block_elems, dtype=kv_cache.dtype,
                                  device=kv_cache.device)

    def fits(self, peer: int, num_blocks: int) -> bool:
        return self.rings[peer].fits(num_blocks)

    def take(self, peer: int, num_blocks: int) -> torch.Tensor:
        start = (peer * self.blocks_per_peer + self.rings[peer].take(num_blocks)) * self.block_elems
        flat = self.buffer[start:start + num_blocks * self.block_elems]
        layers, two, *rest = self.block_shape
        return flat.view(layers, two, num_blocks, *rest)

    def release(self, peer: int) -> None:
        self.rings[peer].release()


def write_blocks(kv_cache: torch.Tensor, block_table: list[int], blocks: torch.Tensor) -> None:
    """Put received blocks into the cache at the request's own block ids (queued on the current
    stream: the host does not wait)."""
    kv_cache.index_copy_(2, block_index(block_table, kv_cache.device), blocks)


class WorkerShards:
    """A tensor-parallel worker's part of its replica's transfers: the pieces of its KV shard the
    head plan has it send to or receive from the peer replica's ranks. Rank 0 forwards each of its own moves to its
    workers (engine.disagg_replica) in its message order, so a gather is queued before any later
    step that reuses the blocks, and a receive is posted before any step that could read them.
    A received shard is written into the cache before the worker's next step, the device ordering
    that step after the receive; rank 0 schedules the request only once its own shard landed."""

    def __init__(self, spec: LinkSpec, num_prefill: int, kv_cache: torch.Tensor, num_kv_heads: int,
                 max_blocks_per_seq: int) -> None:
        self.link = KVLink(spec, kv_cache.device, num_kv_heads)
        self.link.warm_up(num_prefill)
        self.link.stage(kv_cache, num_prefill, max_blocks_per_seq)
        self.mover = BlockMover(kv_cache.device)
        self.sends: list[tuple[Move, torch.Tensor]] = []  # move, and the copy it sends (kept alive until done)
        self.receiving: list[tuple[Move, torch.Tensor, list[int], int]] = []  # and the source replica

    def send(self, kv_cache: torch.Tensor, block_table: list[int], dst: int) -> None:
        self._reap()
        if not self.link.sends_to(dst):
            return  # a replicated head another rank sends: nothing of this rank's is owed
        blocks = self.mover.gather(kv_cache, block_table)
        self.sends.append((self.mover.send(self.link, blocks, dst), blocks))

    def recv(self, kv_cache: torch.Tensor, block_table: list[int], src: int) -> None:
        # rank 0 frees its staging as its own shard lands, which can be before this rank's step
        # wrote its shard: then the ring is full here, and this rank writes what it holds first
        pool = self.link.staging
        assert pool is not None, "a receive on a replica without staging (a prefill replica)"
        if not pool.fits(src, len(block_table)):
            self.before_step(kv_cache)
        staging = pool.take(src, len(block_table))
        self.receiving.append((self.link.recv(staging, src), staging, block_table, src))

    def before_step(self, kv_cache: torch.Tensor) -> None:
        """Write every posted receive into the cache (on a GPU the host does not wait), freeing its
        staging (a later receive into it is ordered after the write: NCCL's stream waits for the
        current one)."""
        for work, staging, table, src in self.receiving:
            work.wait()
            self.mover.scatter(kv_cache, table, staging)
            assert self.link.staging is not None
            self.link.staging.release(src)
        self.receiving = []
        self._reap()

    def _reap(self) -> None:
        # NOTE gloo's sends learn they are done only in wait(), which could wait for a peer busy
        # in a step: on CPU they are kept until close()
        if self.link.device.type == "cuda":
            self.sends = [(work, blocks) for work, blocks in self.sends if not work.is_completed()]

    def close(self) -> None:
        for work, _ in self.sends:
            work.wait()
        self.sends = []
