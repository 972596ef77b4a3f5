"""A disaggregated fleet of replicas that run their own loops in other processes (the engine's:
engine.disagg_replica), routed on the wall clock. Links 0..P-1 are prefill replicas, P..P+D-1
decode replicas; a replica's rank on the KV link is its link index.

Messages, beside engine.core.remote_replica's ("requests", "end", "shutdown", "report", "done"):

  router -> decode    ("receive_kv", (request, prefill rank)) reserve blocks, receive its KV, decode it
  decode -> router    ("reserved", request id)                blocks reserved, the receive posted
  router -> prefill   ("send_kv", (request id, decode rank))  send its held blocks there, release them
                      ("release", request id)                 it ended with its first token: release
  prefill -> router   ("sent", (request id, start_s, bytes))  the send was posted at start_s
  decode -> router    ("landed", (request id, t_s))           the KV is in its cache at t_s

A prefill copy reported finished is handed off as the simulated fleet does
(engine.core.disagg_fleet): a request its first token ended is finished there; any other goes to
the decode replica the decode router picks. "end" goes to every replica once every arrival was
dispatched and every copy handed off.

NOTE back-pressure as in the simulated fleet: the prefill replica is told to send only once the
decode replica has reserved blocks for the request and posted the receive, so until then the
request's blocks stay held on the prefill replica (counting against its admission), and no copy
of them waits outside a cache for a decode replica that has no room.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from engine.core.disagg import prefill_copy
from engine.core.disagg_types import DisaggResult, Transfer
from engine.core.fleet import ReplicaLinks, receive_timeout
from engine.core.loop import Clock, FleetStepHook, RunResult, StepLog
from engine.core.remote_replica import ReplicaView, Report, keep_launches
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.routers import Router


@dataclass(frozen=True)
class LinkSpec:
    """A disaggregated fleet replica's place on the KV link (engine.kv_link). Every TP rank of
    every replica joins the link, numbered replica by replica (link_rank). A request's KV moves
    from the prefill replica's TP ranks to the decode replica's by engine.core.kv_heads's plan:
    rank to same rank between pools of one TP size, KV heads regrouped between two sizes."""

    rank: int  # the replica: prefill replicas first, then decode replicas
    size: int  # replicas
    port: int
    timeout_s: float
    tps: tuple[int, ...] = ()  # each replica's TP size (empty: 1 each)
    tp_rank: int = 0  # this process's rank within its replica

    def __post_init__(self) -> None:
        if self.tps and (len(self.tps) != self.size or min(self.tps) < 1):
            raise ValueError(f"LinkSpec.tps must give each of the {self.size} replicas a TP size >= 1, got {self.tps}")

    def tp_of(self, replica: int) -> int:
        return self.tps[replica] if self.tps else 1

    @property
    def tp(self) -> int:
        return self.tp_of(self.rank)

    def link_rank(self, replica: int, tp_rank: int) -> int:
        """The link's process rank of a replica's TP rank."""
        return sum(self.tp_of(i) for i in range(replica)) + tp_rank

    @property
    def world_size(self) -> int:
        return self.link_rank(self.size, 0)


class _Router:
    def __init__(self, links: ReplicaLinks, num_prefill: int, decode_router: Router, max_model_len: int,
                 on_step: FleetStepHook | None) -> None:
        self.links, self.num_prefill = links, num_prefill
        self.views = [ReplicaView() for _ in range(len(links))]
        self.results = [RunResult(requests=[], steps=StepLog()) for _ in range(len(links))]
        self.decode_router, self.max_model_len, self.on_step = decode_router, max_model_len, on_step
        self.originals: dict[str, Request] = {}
        self.transfers: dict[str, Transfer] = {}
        self.unresolved = 0  # dispatched to a prefill replica, not yet handed off or rejected
        self.done: set[int] = set()
        self.landed: dict[str, float] = {}  # request id -> when its KV was in the decode replica's cache
        self.senders: dict[str, int] = {}  # request id -> its prefill replica, until the decode side reserved

    def handle(self, index: int, kind: str, payload: object) -> None:
        if kind == "report":
            report = cast(Report, payload)
            self.views[index].reported(report)
            result = self.results[index]
            result.steps.extend(report.steps)
            result.rejected.update(report.rejected)
            keep_launches(report, result)
            self.unresolved -= len(report.rejected) if index < self.num_prefill else 0
            if index < self.num_prefill:
                for copy in report.finished:
                    self._handoff(index, copy)
            else:
                result.requests.extend(report.finished)
            if self.on_step is not None:
                for i, record in enumerate(report.steps, start=1):
                    last = i == len(report.steps) and index >= self.num_prefill
                    self.on_step(index, record, report.finished if last else [])
        elif kind == "reserved":
            rid = cast(str, payload)
            self.links.send(self.senders.pop(rid), "send_kv", (rid, index))
        elif kind == "sent":
            rid, start, nbytes = cast("tuple[str, float, int]", payload)
            self.transfers[rid].start_s, self.transfers[rid].bytes = start, nbytes
        elif kind == "landed":  # its "sent" may come after it: the two replicas' pipes are not ordered
            rid, t = cast("tuple[str, float]", payload)
            self.landed[rid] = t
        elif kind == "done":
            self.done.add(index)
            self.results[index].makespan_s = cast(float, payload)
        else:
            raise RuntimeError(f"replica {index}: unexpected message {kind!r}")

    def _handoff(self, index: int, copy: Request) -> None:
        rid = copy.request_id
        self.unresolved -= 1
        request = self.originals[rid]
        self.transfers[rid].ready_s = copy.first_token_time or 0.0
        request.token_ids = list(copy.token_ids)
        for name in ("first_scheduled_time", "first_token_time", "num_cached_tokens", "num_preemptions",
                     "num_recomputed_tokens", "max_computed_tokens"):
            setattr(request, name, getattr(copy, name))
        if request.max_tokens is None:
            request.max_tokens = self.max_model_len - request.num_prompt_tokens
        if copy.finish_reason is not FinishReason.LENGTH or request.max_tokens <= 1:
            self.links.send(index, "release", rid)
            request.status, request.finish_reason = RequestStatus.FINISHED, copy.finish_reason
            request.finish_time = copy.finish_time
            self.results[index].requests.append(request)
            return
        decode = self.views[self.num_prefill:]
        choice = self.decode_router.route(request, decode)
        if not 0 <= choice < len(decode):
            raise RuntimeError(f"decode router chose replica {choice} of {len(decode)}")
        target = self.num_prefill + choice
        self.transfers[rid].decode = choice
        self.views[target].dispatched(request)
        self.senders[rid] = index
        self.links.send(target, "receive_kv", (request, index))


def run_disagg_wall(links: ReplicaLinks, num_prefill: int, requests: Iterable[Request], prefill_router: Router,
                    decode_router: Router, clock: Clock, max_model_len: int,
                    on_step: FleetStepHook | None = None) -> DisaggResult:
    """Serve requests to completion on the replicas behind links (prefill first); the replicas'
    clocks share clock's origin (the caller passed it on)."""
    pending = sorted(requests, key=lambda r: r.arrival_time)
    fleet = _Router(links, num_prefill, decode_router, max_model_len, on_step)
    next_arrival, ended = 0, False
    while len(fleet.done) < len(links):
        now = clock.now()
        batches: dict[int, list[Request]] = {}
        while next_arrival < len(pending) and pending[next_arrival].arrival_time <= now:
            request = pending[next_arrival]
            next_arrival += 1
            choice = prefill_router.route(request, fleet.views[:num_prefill])
            if not 0 <= choice < num_prefill:
                raise RuntimeError(f"prefill router chose replica {choice} of {num_prefill}")
            fleet.originals[request.request_id] = request
            fleet.transfers[request.request_id] = Transfer(choice)
            fleet.unresolved += 1
            copy = prefill_copy(request)
            fleet.views[choice].dispatched(copy)
            batches.setdefault(choice, []).append(copy)
        for index, batch in batches.items():
            links.send(index, "requests", batch)
        if next_arrival == len(pending) and fleet.unresolved == 0 and not ended:
            for index in range(len(links)):
                links.send(index, "end", None)
            ended = True
        timeout = receive_timeout(pending, next_arrival, clock)
        if timeout == 0.0:
            continue  # slept to the next arrival: dispatch it now
        for index, kind, payload in links.receive(timeout):
            fleet.handle(index, kind, payload)
    return _result(fleet, pending)


def _result(fleet: _Router, pending: list[Request]) -> DisaggResult:
    p = fleet.num_prefill
    finished = {r.request_id: r for result in fleet.results for r in result.requests}
    rejected = {rid: why for result in fleet.results for rid, why in result.rejected.items()}
    transfers = {rid: t for rid, t in fleet.transfers.items() if rid in finished}
    for rid, t in transfers.items():
        t.transfer_s = fleet.landed[rid] - t.start_s if t.decode >= 0 else math.nan
    return DisaggResult([finished[r.request_id] for r in pending if r.request_id in finished],
                        fleet.results[:p], fleet.results[p:], transfers, rejected,
                        max((r.makespan_s for r in fleet.results), default=0.0), 0)
