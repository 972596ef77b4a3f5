"""The loops of a disaggregated engine fleet's replica processes (engine.core.disagg_wall has the
router's side and the messages).

A prefill replica serves prefill copies (engine.core.disagg.PrefillReplica: the blocks of a copy
that sampled its first token are held) and, told ("send_kv", (request id, decode rank)), copies
the request's blocks out of its cache, starts sending them over the KV link (each TP rank the
pieces of its shard the head plan gives it: engine.core.kv_heads) and releases them,
none of it waiting on its GPU (engine.kv_link.BlockMover);
told ("release", request id), it releases them without a transfer.

A decode replica is told ("receive_kv", (request, prefill rank)), in the order its transfers were
routed. First come first served, as soon as it has the blocks and a sequence slot for the
request (DecodeReplica.can_take) and room in the staging ring of its prefill peer (the link's
StagingPool, a fixed budget of its memory plan: engine.core.kv_staging), it reserves them,
posts the receive and reports ("reserved", request id), on which the router tells the prefill
replica to send; when the receive completes it writes the blocks into its cache at the reserved
ids, admits the request (its first token sampled on the prefill replica) and reports ("landed",
(request id, time)).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.launch_log import LaunchLog
from engine.core.remote_replica import Connection, step_and_report
from engine.core.request import Request
from engine.kv_link import BlockMover, KVLink, StagingPool

POLL_S = 2e-4  # how long an idle replica with a transfer under way waits for a message


def _cache(replica) -> torch.Tensor:
    cache = replica.executor.runner.kv_cache
    assert cache is not None, "the executor has no KV cache"
    return cache


def serve_prefill(replica: PrefillReplica, conn: Connection, link: KVLink,
                  launches: LaunchLog | None = None) -> bool:
    """Serve until "end" has come, every copy's blocks are released and every send completed;
    then ("done", makespan_s) and False. True at once on "shutdown"."""
    sends: list[tuple[Any, torch.Tensor]] = []  # work, and the copy it sends (kept alive until done)
    mover = BlockMover(link.device)
    received, ending, makespan = 0, False, 0.0
    while True:
        sends = [(work, blocks) for work, blocks in sends if not link.completed(work)]
        busy = replica.next_event_time() < math.inf
        if not busy and ending and not replica.holding.held:
            for work, _ in sends:
                work.wait()
            conn.send(("done", makespan))
            return False
        for kind, payload in _messages(conn, None if not busy and not sends else (0.0 if busy else POLL_S)):
            if kind == "requests":
                replica.inbox.extend(payload)
                received += len(payload)
            elif kind == "send_kv":
                rid, dst = payload
                table = replica.holding.held[rid]
                blocks = mover.gather(_cache(replica), table)
                start = replica.clock.now()
                sends.append((mover.send(link, blocks, dst), blocks))
                _forward(replica, "kv_send", (table, dst))
                # the copy is taken (any later step on this device waits for it): the blocks may go
                replica.release(rid, start)
                conn.send(("sent", (rid, start, link.request_bytes(blocks, dst))))
            elif kind == "release":
                replica.release(payload, replica.clock.now())
            elif kind == "end":
                ending = True
            elif kind == "shutdown":
                return True
            else:
                raise ValueError(f"prefill replica {replica.index}: unknown message {kind!r}")
        makespan = step_and_report(replica, conn, received, makespan, launches)


def serve_decode(replica: DecodeReplica, conn: Connection, link: KVLink,
                  launches: LaunchLog | None = None) -> bool:
    """Serve until "end" has come and every transfer landed and decoded; then ("done", makespan_s)."""
    waiting: deque[tuple[Request, int]] = deque()  # told to receive, blocks not yet reserved
    receiving: deque[tuple[Request, int, Any, torch.Tensor]] = deque()  # receive posted
    mover = BlockMover(link.device)
    staging = link.staging
    assert staging is not None, "a decode replica's link has its staging (KVLink.stage)"
    received, ending, makespan = 0, False, 0.0
    while True:
        busy = replica.next_event_time() < math.inf
        if not busy and ending and not waiting and not receiving:
            conn.send(("done", makespan))
            return False
        for kind, payload in _messages(conn, None if not (busy or waiting or receiving) else (0.0 if busy else POLL_S)):
            if kind == "receive_kv":
                waiting.append(payload)
                received += 1
            elif kind == "end":
                ending = True
            elif kind == "shutdown":
                return True
            else:
                raise ValueError(f"decode replica {replica.index}: unknown message {kind!r}")
        # NOTE first come first served: a request that does not fit yet (cache blocks, a sequence slot,
        # or its peer's staging ring) holds back the ones behind it, whose senders post in this same order
        while waiting and _can_receive(replica, staging, *waiting[0]):
            request, src = waiting.popleft()
            replica.reserve(request)
            blocks = staging.take(src, len(request.block_table))
            receiving.append((request, src, link.recv(blocks, src), blocks))
            _forward(replica, "kv_recv", (list(request.block_table), src))
            conn.send(("reserved", request.request_id))
        while receiving and link.completed(receiving[0][2]):
            request, src, _, blocks = receiving.popleft()
            mover.scatter(_cache(replica), request.block_table, blocks)
            staging.release(src)  # the next receive into it waits for the scatter (NCCL's stream waits)
            now = replica.clock.now()
            replica.arrived(request, now)
            conn.send(("landed", (request.request_id, now)))
        makespan = step_and_report(replica, conn, received, makespan, launches)


def _can_receive(replica: DecodeReplica, staging: StagingPool, request: Request, src: int) -> bool:
    need = replica.scheduler.block_manager.blocks_for(request.num_prompt_tokens)
    return replica.can_take(request) and staging.fits(src, need)


def _forward(replica, kind: str, payload) -> None:
    """A TP replica's move, for its workers to make with their shards (engine.kv_link.WorkerShards)."""
    workers = replica.executor.workers
    if workers:
        workers.send(kind, payload)


def _messages(conn, timeout: float | None):
    """Messages now; with timeout None, block for the first; else wait at most timeout for one."""
    if timeout is None or conn.poll(timeout):
        yield conn.recv()
    while conn.poll():
        yield conn.recv()
