"""The KV link of a disaggregated engine fleet: one process group over its replicas (prefill
replicas rank 0..P-1, decode replicas P..P+D-1), and the moves of a request's KV blocks over it.

The group is a torch.distributed ProcessGroup built on its own TCPStore (NCCL between GPUs, gloo
on CPU), not the default group: a replica's default group is its tensor-parallel group
(engine.tp.group), and this one must live beside it. Blocks move with point-to-point send/recv;
torch matches the sends of one source with the receives posted for it in order, so each side
posts them in the order the router ordered the transfers (engine.core.disagg_wall).

A request's blocks travel as one tensor [num_layers, 2, num_blocks_of_request, block_size,
num_kv_heads, head_dim]: the runner's cache (engine.runner: [num_layers, 2, num_blocks,
block_size, num_kv_heads, head_dim]) indexed by the request's block table along dim 2.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from engine.core.disagg_wall import LinkSpec
from engine.tp.group import apply_safe_env


class KVLink:
    """This process's end of the link. Peers are named by replica index; a TP rank talks to the
    same TP rank of the peer replica (LinkSpec)."""

    def __init__(self, spec: LinkSpec, device: torch.device) -> None:
        apply_safe_env()
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        rank, size = spec.rank * spec.tp + spec.tp_rank, spec.size * spec.tp
        self.store = dist.TCPStore("127.0.0.1", spec.port, size, is_master=rank == 0, timeout=timeout)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(self.store, rank, size, options)
        else:
            self.group = dist.ProcessGroupGloo(self.store, rank, size, timeout=timeout)
        self.rank, self.replicas, self.device = spec.rank, spec.size, device
        self.tp, self.tp_rank = spec.tp, spec.tp_rank

    def peer(self, replica: int) -> int:
        return replica * self.tp + self.tp_rank

    def warm_up(self, num_prefill: int) -> None:
        """One small message from every prefill replica to every decode replica (rank to rank),
        so that no request's transfer pays for setting up a pair's connection (NCCL makes one
        per pair on first use)."""
        peers = range(num_prefill, self.replicas) if self.rank < num_prefill else range(num_prefill)
        works = []
        for peer in peers:
            token = torch.zeros(1, device=self.device)
            works.append((self.send(token, peer) if self.rank < num_prefill else self.recv(token, peer), token))
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

    def send(self, blocks: torch.Tensor, dst: int):
        """Start sending a request's blocks to replica dst (a tensor the caller keeps alive until
        the work completes)."""
        return self.group.send([blocks], self.peer(dst), 0)

    def recv(self, blocks: torch.Tensor, src: int):
        """Start receiving a request's blocks from replica src into `blocks` (shaped as the sender's)."""
        return self.group.recv([blocks], self.peer(src), 0)


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

    def send(self, link: KVLink, blocks: torch.Tensor, dst: int):
        """Start sending gathered blocks: after the gather, on its stream (the caller keeps blocks
        alive until the work completes)."""
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
    """A receive buffer for num_blocks blocks of this cache's layout."""
    shape = (kv_cache.shape[0], 2, num_blocks, *kv_cache.shape[3:])
    return torch.empty(shape, dtype=kv_cache.dtype, device=kv_cache.device)


def write_blocks(kv_cache: torch.Tensor, block_table: list[int], blocks: torch.Tensor) -> None:
    """Put received blocks into the cache at the request's own block ids (queued on the current
    stream: the host does not wait)."""
    kv_cache.index_copy_(2, block_index(block_table, kv_cache.device), blocks)


class WorkerShards:
    """A tensor-parallel worker's part of its replica's transfers: its own KV shard, moved to or
    from the same TP rank of the peer replica. Rank 0 forwards each of its own moves to its
    workers (engine.disagg_replica) in its message order, so a gather is queued before any later
    step that reuses the blocks, and a receive is posted before any step that could read them.
    A received shard is written into the cache before the worker's next step, the device ordering
    that step after the receive; rank 0 schedules the request only once its own shard landed."""

    def __init__(self, spec: LinkSpec, num_prefill: int, device: torch.device) -> None:
        self.link = KVLink(spec, device)
        self.link.warm_up(num_prefill)
        self.mover = BlockMover(device)
        self.sends: list[tuple[Any, torch.Tensor]] = []  # work, and the copy it sends (kept alive until done)
        self.receiving: list[tuple[Any, torch.Tensor, list[int]]] = []

    def send(self, kv_cache: torch.Tensor, block_table: list[int], dst: int) -> None:
        self._reap()
        blocks = self.mover.gather(kv_cache, block_table)
        self.sends.append((self.mover.send(self.link, blocks, dst), blocks))

    def recv(self, kv_cache: torch.Tensor, block_table: list[int], src: int) -> None:
        staging = staging_for(kv_cache, len(block_table))
        self.receiving.append((self.link.recv(staging, src), staging, block_table))

    def before_step(self, kv_cache: torch.Tensor) -> None:
        """Write every posted receive into the cache (on a GPU the host does not wait)."""
        for work, staging, table in self.receiving:
            work.wait()
            self.mover.scatter(kv_cache, table, staging)
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
