"""The two kinds of replica of a disaggregated fleet (engine.core.disagg_fleet runs them).

A prefill replica serves a copy of each request capped at one output token (prefill_copy): it
computes the prompt, chunked as its policy says, and samples the first token. Its block manager
(HoldingBlockManager) keeps the blocks of a request that leaves with its first token until its KV
has been sent, so they count against the replica's admission meanwhile.

A decode replica receives the request itself with its KV already in blocks reserved for it at
the start of the transfer (reserve) and admits it straight into the running queue
(admit_prefilled): its first step there computes the first token's KV and samples the second.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from engine.core.block_manager import BlockManager
from engine.core.executor import Executor
from engine.core.loop import Clock, Replica, tokens_left
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler


class HoldingBlockManager(BlockManager):
    """A prefill replica's pool: a request that leaves having sampled its first token keeps its
    blocks, under its id in `held`, until release(). Any other free() (a preemption) frees."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.held: dict[str, list[int]] = {}

    def free(self, request: Request) -> None:
        if request.block_table and request.num_tokens > request.num_prompt_tokens:
            # NOTE: a prefill copy gets a token (or, overlapped, its placeholder) only in the step that
            # finishes it; a preemption never sees one, so this is the finishing free().
            self.held[request.request_id] = request.block_table
            request.block_table = []
            request.num_registered_blocks = 0
            return
        super().free(request)

    def release(self, request_id: str) -> None:
        """The request's KV has left: its blocks go back (a request that held none: nothing)."""
        table = self.held.pop(request_id, None)
        if table is not None:
            self.free_table(table)

    @property
    def num_held_blocks(self) -> int:
        return sum(map(len, self.held.values()))


def prefill_copy(request: Request) -> Request:
    """The prefill replica's request: the same id, prompt and arrival, capped at one output token."""
    params = dataclasses.replace(request.sampling_params, max_tokens=1)
    return Request(request.request_id, request.prompt_token_ids, params, request.arrival_time)


class TransferReplica(Replica):
    """A replica that can stall: an empty step while requests wait (the scheduler's RuntimeError)
    is a wait for blocks that a transfer frees or fills when waits_on_transfers() says so; the
    fleet's release() or arrived() resumes it. on_stall, if set, is told when it stalls (a stalled
    replica's loop has nothing to run: it handles messages at once)."""

    def __init__(self, index: int, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        super().__init__(index, scheduler, executor, clock)
        self.stalled = False
        self.on_stall: Callable[[], None] | None = None

    def waits_on_transfers(self) -> bool:
        raise NotImplementedError

    def next_event_time(self) -> float:
        return math.inf if self.stalled else super().next_event_time()

    def tick(self) -> None:
        try:
            super().tick()
        except RuntimeError:
            if not self.waits_on_transfers():
                raise
            self.stalled = True
            if self.on_stall is not None:
                self.on_stall()


class PrefillReplica(TransferReplica):
    """A replica whose finished requests keep their KV blocks until release(request_id)."""

    def __init__(self, index: int, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        bm = scheduler.block_manager
        # before anything is allocated: the scheduler was just built
        assert bm.num_used_blocks == 0, "a prefill replica needs a fresh scheduler"
        scheduler.block_manager = HoldingBlockManager(bm.num_blocks, bm.block_size, bm.enable_prefix_caching)
        super().__init__(index, scheduler, executor, clock)

    def waits_on_transfers(self) -> bool:
        # an empty step with requests waiting: every block is taken, and nothing runs here to free
        # one, so the blocks held for transfers are the ones it waits for
        return bool(self.holding.held)

    @property
    def holding(self) -> HoldingBlockManager:
        bm = self.scheduler.block_manager
        assert isinstance(bm, HoldingBlockManager)
        return bm

    def release(self, request_id: str, t: float) -> None:
        """The request's KV left at t: its blocks go back, and a stalled replica resumes at t."""
        self.holding.release(request_id)
        if self.stalled:
            self.stalled = False
            self.clock.wait_until(t)


class DecodeReplica(TransferReplica):
    """A replica fed requests whose prompt KV arrives by transfer: reserve() at the transfer's
    start, then its inbox at the transfer's end, from which admit() takes them all at once."""

    def __init__(self, index: int, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        self.incoming: dict[str, Request] = {}  # blocks reserved, KV in transit
        super().__init__(index, scheduler, executor, clock)

    def waits_on_transfers(self) -> bool:
        # an empty step with a preempted request waiting and none running: the blocks it lacks
        # are reserved for KV in transit, so it waits for that to land
        return bool(self.incoming)

    def outstanding_requests(self) -> int:
        return super().outstanding_requests() + len(self.incoming)

    def outstanding_tokens(self) -> int:
        return super().outstanding_tokens() + sum(map(tokens_left, self.incoming.values()))

    def blocks_to_receive(self, request: Request) -> int:
        return self.scheduler.block_manager.blocks_for(request.num_prompt_tokens)

    def can_take(self, request: Request) -> bool:
        """Free blocks for the request's prompt KV, and a sequence slot under max_num_seqs."""
        self.settle()  # a booked run's finished requests leave, and free their blocks, as step by step
        scheduler = self.scheduler
        seqs = len(scheduler.requests) + len(self.inbox) + len(self.incoming)
        return (seqs < scheduler.config.max_num_seqs
                and self.blocks_to_receive(request) <= scheduler.block_manager.num_free_blocks)

    def fits_ever(self, request: Request) -> str | None:
        """Why the request can never be decoded here (its whole KV exceeds the cache), else None."""
        bm = self.scheduler.block_manager
        max_tokens = request.max_tokens if request.max_tokens is not None else 1
        need = bm.blocks_for(request.num_prompt_tokens + max_tokens - 1)
        if need > bm.num_blocks:
            return (f"request {request.request_id!r} needs {need} KV blocks to decode but decode replica "
                    f"{self.index}'s whole cache has {bm.num_blocks}")
        return None

    def reserve(self, request: Request) -> None:
        """Take blocks for the request's prompt KV (can_take() said there are enough)."""
        self.scheduler.block_manager.allocate(request, request.num_prompt_tokens)
        self.incoming[request.request_id] = request

    def arrived(self, request: Request, t: float) -> None:
        """The request's KV landed at t: it is admitted at this replica's next iteration."""
        # a booked run ends here: the step-by-step path plans the next step with the request in it
        self.settle()
        if self.clock.now() < t:
            # every busy replica has run up to t before an event at t is handled: this one is idle or stalled
            assert self.stalled or (not self.scheduler.has_unfinished() and self.in_flight is None and not self.inbox)
            self.clock.wait_until(t)
        self.stalled = False
        del self.incoming[request.request_id]
        self.inbox.append(request)
        # a simulated replica's device writes the KV into its cache before the next step
        # (sim.executor.SimExecutor.landed); the engine's has done that write already
        landed = getattr(self.executor, "landed", None)
        if landed is not None:
            landed(request.num_prompt_tokens)

    def admit(self, now: float) -> None:
        while self.inbox:
            admit_prefilled(self.scheduler, self.inbox.popleft())


def admit_prefilled(scheduler: Scheduler, request: Request) -> None:
    """Put a request whose prompt KV fills its block table straight into the running queue: its
    prompt counts as computed (and its full blocks are offered to the prefix cache); the next
    step computes its last sampled token and samples the one after."""
    rid = request.request_id
    if rid in scheduler.requests:
        raise ValueError(f"duplicate request id {rid!r}: a request with this id is still unfinished")
    bm = scheduler.block_manager
    prompt_len = request.num_prompt_tokens
    assert len(request.block_table) == bm.blocks_for(prompt_len), "reserve() the prompt's blocks first"
    assert request.num_output_tokens >= 1, "a prefilled request carries its first token"
    request.num_computed_tokens = prompt_len
    request.max_computed_tokens = max(request.max_computed_tokens, prompt_len)
    request.status = RequestStatus.RUNNING
    scheduler.requests[rid] = request
    scheduler.running.append(request)
    bm.register_computed(request)
