"""What a disaggregated fleet does at each event (engine.core.disagg_fleet's loop hands them here).

An arrival goes to a prefill replica (the prefill router), which serves its prefill_copy. When the
copy samples the first token (the request's TTFT), the request is handed off: the decode router
picks among the decode replicas that can take it now (free blocks for its prompt KV, a sequence
slot), blocks are reserved there and the transfer starts; when it ends, the prefill replica's
blocks are released and the decode replica admits the request. A request whose first token ends
it (max_tokens=1, EOS, a stop token) finishes on its prefill replica and moves nothing.

NOTE back-pressure: when no decode replica can take a request, it waits, first come first served,
on its prefill replica holding its blocks; waiting requests are offered again whenever a decode
step ends. A decode replica takes one only with room in its receive staging ring for the request's
prefill replica (engine.core.kv_staging.StagingRing, staging_blocks_per_peer of the decode
replica's max_model_len: the engine's StagingPool): its blocks are taken as the transfer starts
and freed oldest first, each once it and every earlier transfer from that peer landed (the
engine scatters receives in the order it posted them). Layer-by-layer overlap (TransferPricer)
only applies to a transfer that starts the moment the prefill ends: one that waited finds its KV
complete.

handshake=True prices the engine's protocol (engine.disagg_replica), where each replica's loop
handles messages only between its steps: the decode replica learns of the transfer at its next step
boundary after the first token; the prefill replica, told to send, posts the send at its next step
boundary, after the step then in flight on its GPU (the engine's copy out before BlockMover
synchronised the host with it; queue_behind_step=True prices BlockMover), and frees its blocks
there; the decode replica sees the receive complete at its next step boundary and writes the blocks
after its step in flight, so the reported transfer_s runs from the send to the start of the first
decode step that computes the request (the engine's). A replica with nothing running handles a
message at once, and so does one that stalls (nothing it can run until a transfer frees or fills
blocks): a message that waited for its next step boundary is handled when it stalls, since that step
never comes.

queue_behind_step=True prices the engine's block moves (engine.kv_link.BlockMover): no host waits
on its GPU for a move, but the gather, hence the send, is queued on the prefill GPU behind the
step in flight there (with overlapped steps the next step is already launched when the send is
posted). So the wire starts at the end of the prefill replica's step in flight when the send is
posted (if any; _wire_start, the one place of the rule), and the transfer (from the post) lasts
that wait plus the wire. With handshake=True the replicas then handle the send and the landing
at their next step boundary, not after the step then in flight (the hosts do not wait), and the
prefill replica frees the blocks as it posts the send.

recv_behind_step, landing_lag_s and send_lag_s price the receive's side (engine.core.transfer_receive;
the receive's queue behind the decode step in flight is _behind_step's rule, as the send's).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_types import DisaggResult, Transfer, TransferPricer
from engine.core.kv_staging import FleetStaging, StagingRing
from engine.core.loop import FleetStepHook, Replica, StepRecord, StepRun
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.routers import Router
from engine.core.step_log import first_step_end
from engine.core.transfer_receive import RECV_START, SEND_START, WIRE_SECONDS, LagDraw, LandingWatch, Sigma, WireGates

HANDOFF, LANDED, RETRY, SEND, POST, WIRE, RECV, TOLD = 0, 1, 2, 3, 4, 5, 6, 7


class FleetEvents:
    def __init__(self, prefill: Sequence[PrefillReplica], decode: Sequence[DecodeReplica],
                 decode_router: Router, pricer: TransferPricer, on_step: FleetStepHook | None,
                 handshake: bool = False, queue_behind_step: bool = False, recv_behind_step: bool = False,
                 landing_lag_s: float = 0.0, send_lag_s: float = 0.0, landing_lag_sigma: Sigma = 0.0,
                 send_lag_sigma: Sigma = 0.0) -> None:
        self.prefill, self.decode = prefill, decode
        self.handshake = handshake
        self.queue_behind_step = queue_behind_step
        self.recv_behind_step, self.gates = recv_behind_step, WireGates()
        self.landing_lag = LagDraw(landing_lag_s, landing_lag_sigma)
        self.send_lag = LagDraw(send_lag_s, send_lag_sigma)
        self.landings = LandingWatch(self.landing_lag)
        # handshake: per replica (prefill first), what waits for the end of its step in flight
        self.after_step: dict[int, list[tuple[int, Request]]] = {}
        self.replicas: list[Replica] = [*prefill, *decode]
        self.decode_router, self.pricer, self.on_step = decode_router, pricer, on_step
        self.events: list[tuple[float, int, int, Request]] = []
        self.seq = 0
        self.originals: dict[str, Request] = {}
        self.transfers: dict[str, Transfer] = {}
        self.blocked: deque[Request] = deque()
        self.retry_pending = False
        self.rejected: dict[str, str] = {}
        self.max_blocked = 0
        self.staging = FleetStaging()
        for index, replica in enumerate(self.replicas):
            self._hook(index, replica)

    def _hook(self, index: int, replica: Replica) -> None:
        """Replica `index` (prefill first, then decode) reports its steps and stalls here."""
        replica.on_step = self._prefill_step if isinstance(replica, PrefillReplica) else self._decode_step
        if isinstance(replica, PrefillReplica | DecodeReplica):
            replica.on_stall = lambda: self._boundary(index, replica.clock.now())

    def push(self, t: float, kind: int, request: Request) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, request))
        self.seq += 1

    # ---- hooks: a replica finished a step ------------------------------------------------

    def _prefill_step(self, index: int, record: StepRecord | StepRun, finished: list[Request]) -> None:
        self._step_ended(index, record)
        for copy in finished:
            self.push(copy.first_token_time or 0.0, HANDOFF, copy)
        if self.on_step is not None:
            self.on_step(index, record, [])

    def _decode_step(self, index: int, record: StepRecord | StepRun, finished: list[Request]) -> None:
        self._step_ended(len(self.prefill) + index, record)
        if self.landing_lag:
            self.landings.stepped(index, record)
        if self.blocked and not self.retry_pending:
            self.push(first_step_end(record), RETRY, self.blocked[0])
            self.retry_pending = True
        if self.on_step is not None:
            self.on_step(len(self.prefill) + index, record, finished)

    def _step_ended(self, index: int, record: StepRecord | StepRun) -> None:
        if index in self.after_step:
            # a message waits for the step in flight when it came: a run's last (no step of a run
            # starts past the fleet's next event); a receive queued on the GPU, for its first
            self._boundary(index, record.end_s if isinstance(record, StepRun) else record.start_s + record.duration_s,
                           first_step_end(record))

    def _boundary(self, index: int, end: float, first_end: float | None = None) -> None:
        """Replica `index`'s loop is between steps at `end`: it handles the messages that waited."""
        waiting = self.after_step.pop(index, None)
        if waiting:
            for kind, request in waiting:
                if kind == RECV:
                    self.push(end if first_end is None else first_end, RECV, request)
                elif kind != LANDED:
                    self.push(end, kind, request)
                else:  # landed: the decode step that computes the request starts now
                    transfer = self.transfers[request.request_id]
                    lag = self.landing_lag.after_end(index - len(self.prefill), end)
                    transfer.transfer_s = end + lag - transfer.start_s

    def _loop_boundary(self, index: int, kind: int, request: Request, t: float, past_in_flight: bool) -> float | None:
        """handshake: when replica `index`'s loop handles a message sent at t (past_in_flight: and its
        host has waited for the step then in flight on its device). It has run every iteration that
        starts before t: one that is idle or stalled handles it at once; one inside a step at its
        end (its clock). None when that end is not known yet (the replica's next iteration starts
        at t, the message just behind it, or a step in flight must end first): `kind` is then
        handled for request as the replica's next step ends."""
        replica = self.replicas[index]
        replica.settle()  # a booked run's step in flight is a planned one, as step by step
        if replica.next_event_time() == math.inf and replica.in_flight is None:
            return t
        if (past_in_flight and replica.in_flight is not None) or replica.clock.now() <= t:
            self.after_step.setdefault(index, []).append((kind, request))
            return None
        return replica.clock.now()

    # ---- events --------------------------------------------------------------------------

    def handle(self, t: float, kind: int, request: Request) -> None:
        if kind == HANDOFF:
            self._handoff(t, request)
        elif kind == LANDED:
            transfer = self.transfers[request.request_id]
            self.prefill[transfer.prefill].release(request.request_id, t)
            self.staging.land((transfer.decode, transfer.prefill), request.request_id)
            if self.handshake:  # the engine's landing: seen at the next boundary, after the step in flight
                landed = self.landings.seen(transfer.decode, t) if self.landing_lag else None
                if landed is None:
                    landed = self._loop_boundary(len(self.prefill) + transfer.decode, LANDED, request, t,
                                                 not self.queue_behind_step)
                    if landed is not None and landed > t:
                        landed += self.landing_lag.after_end(transfer.decode, landed)
                if landed is not None:
                    transfer.transfer_s = landed - transfer.start_s
            self.decode[transfer.decode].arrived(request, t)
        elif kind == SEND:  # the prefill replica is told to send
            if self.recv_behind_step:  # the decode replica posted the receive as it reserved
                self._gate(request, RECV_START, self._behind_step(
                    len(self.prefill) + self.transfers[request.request_id].decode, t, request, RECV))
            if self.send_lag:
                self.push(t + self.send_lag.for_request(request.request_id), TOLD, request)
            else:
                self.handle(t, TOLD, request)
        elif kind == TOLD:
            post = self._loop_boundary(self.transfers[request.request_id].prefill, POST, request, t,
                                       not self.queue_behind_step)
            if post is not None:
                self.push(post, POST, request)
        elif kind == POST:
            self._send(t, request)
        elif kind == WIRE and self.recv_behind_step:
            self._gate(request, SEND_START, t)
        elif kind == RECV:  # the decode step the receive queued behind ended
            self._gate(request, RECV_START, t)
        elif kind == WIRE:  # the prefill step the send queued behind ended: the wire starts
            transfer = self.transfers[request.request_id]
            wire_s = transfer.transfer_s
            transfer.transfer_s = t - transfer.start_s + wire_s
            self.push(t + wire_s, LANDED, request)
        else:
            self.retry_pending = False
            while self.blocked and self._start(t, self.blocked[0], blocked=True):
                self.blocked.popleft()

    def _handoff(self, t: float, copy: Request) -> None:
        rid = copy.request_id
        request = self.originals[rid]
        transfer = self.transfers[rid]
        transfer.ready_s = t
        # the prefill side's story is the request's: its first token, queueing, cache hits, recompute
        request.token_ids = list(copy.token_ids)
        for name in ("first_scheduled_time", "first_token_time", "num_cached_tokens", "num_preemptions",
                     "num_recomputed_tokens", "max_computed_tokens", "block_hashes"):
            setattr(request, name, getattr(copy, name))
        if request.max_tokens is None:  # until max_model_len, as the decode replica's scheduler would say
            request.max_tokens = self.decode[0].scheduler.config.max_model_len - request.num_prompt_tokens
        if copy.finish_reason is not FinishReason.LENGTH or request.max_tokens <= 1:
            self.prefill[transfer.prefill].release(rid, t)
            request.status, request.finish_reason, request.finish_time = RequestStatus.FINISHED, copy.finish_reason, t
            return
        why = self.decode[0].fits_ever(request)
        if why is not None:
            self.prefill[transfer.prefill].release(rid, t)
            self.rejected[rid] = why
            return
        if self.blocked or not self._start(t, request, blocked=False):
            self.blocked.append(request)
            self.max_blocked = max(self.max_blocked, len(self.blocked))

    def _decode_open(self) -> Sequence[DecodeReplica]:
        """The decode replicas a transfer may go to (an elastic fleet: its serving ones)."""
        return self.decode

    def _start(self, t: float, request: Request, blocked: bool) -> bool:
        """Reserve decode blocks and start the transfer; False when no decode replica can take it."""
        transfer = self.transfers[request.request_id]
        open_ = [replica for replica in self._decode_open()
                 if replica.can_take(request) and self._ring(replica, transfer.prefill).fits(
                     replica.blocks_to_receive(request))]
        if not open_:
            return False
        choice = self.decode_router.route(request, open_)
        if not 0 <= choice < len(open_):
            raise RuntimeError(f"decode router chose replica {choice} of {len(open_)}")
        target = open_[choice]
        target.reserve(request)
        self.staging.stage((target.index, transfer.prefill), request.request_id, len(request.block_table))
        prefill_s = 0.0 if blocked or request.first_scheduled_time is None else t - request.first_scheduled_time
        transfer.decode = target.index
        if self.handshake:  # the decode replica reserves and says so at its next step boundary
            ready = self._loop_boundary(len(self.prefill) + target.index, SEND, request, t, False)
            if ready is not None:
                self.push(ready, SEND, request)
            return True
        if self.recv_behind_step:
            self._gate(request, RECV_START, self._behind_step(len(self.prefill) + target.index, t, request, RECV))
        self._send(t, request, prefill_s)
        return True

    def _ring(self, replica: DecodeReplica, prefill: int) -> StagingRing:
        """The decode replica's receive staging for transfers from prefill replica `prefill`."""
        config = replica.scheduler.config
        return self.staging.ring((replica.index, prefill),
                                 replica.scheduler.block_manager.blocks_for(config.max_model_len))

    def _send(self, t: float, request: Request, prefill_s: float = 0.0) -> None:
        transfer = self.transfers[request.request_id]
        seconds, nbytes = self.pricer.price(request.num_prompt_tokens, transfer.prefill, transfer.decode, prefill_s)
        transfer.start_s, transfer.transfer_s, transfer.bytes = t, seconds, nbytes
        if self.handshake:  # the engine's prefill replica frees the blocks once their copy is taken
            self.prefill[transfer.prefill].release(request.request_id, t)
        wire = self._behind_step(transfer.prefill, t, request, WIRE) if self.queue_behind_step else t
        if self.recv_behind_step:
            self._gate(request, WIRE_SECONDS, seconds)
            self._gate(request, SEND_START, wire)
            return
        if wire is not None:  # else WIRE comes as the step in flight ends
            transfer.transfer_s = wire - t + seconds
            self.push(wire + seconds, LANDED, request)

    def _behind_step(self, index: int, t: float, request: Request, kind: int) -> float | None:
        """When work queued at t on replica `index`'s GPU (a send's gather: WIRE; a receive: RECV)
        can start: after the step on its GPU at t (engine.kv_link.BlockMover; torch's NCCL receive
        waits for the current stream). That is a step the replica has run past t (it ends at its
        clock), else the one in flight (launched before the move was posted: None, `kind` then
        comes as it ends), else none (t)."""
        replica = self.prefill[index] if kind == WIRE else self.decode[index - len(self.prefill)]
        replica.settle()
        if replica.clock.now() > t:
            return replica.clock.now()
        if replica.in_flight is not None:
            self.after_step.setdefault(index, []).append((kind, request))
            return None
        return t

    def _gate(self, request: Request, which: int, value: float | None) -> None:
        """recv_behind_step: one of the wire's three (None: not known yet); with all, it starts."""
        wire = self.gates.set(request.request_id, which, value)
        if wire is not None:
            start, seconds = wire
            transfer = self.transfers[request.request_id]
            transfer.transfer_s = start - transfer.start_s + seconds
            self.push(start + seconds, LANDED, request)


def fleet_result(fleet: FleetEvents, pending: list[Request]) -> DisaggResult:
    rejected = dict(fleet.rejected)
    for sender in fleet.prefill:
        rejected.update(sender.result.rejected)
    finished = [r for r in pending if r.is_finished]
    transfers = {rid: t for rid, t in fleet.transfers.items() if rid not in rejected}
    for replica in fleet.replicas:
        replica.result.makespan_s = replica.clock.now()
    makespan = max((replica.clock.now() for replica in fleet.replicas), default=0.0)
    return DisaggResult(finished, [r.result for r in fleet.prefill], [r.result for r in fleet.decode], transfers,
                        rejected, makespan, fleet.max_blocked)
