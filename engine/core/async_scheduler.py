"""Scheduling for overlapped steps: step N+1 is planned while step N still runs on the device.

schedule() books a step in full as soon as it is planned: each sampling entry gets a PLACEHOLDER
token, and a request that thereby reaches max_tokens leaves the running set and frees its blocks
at once (the step in flight already holds its KV slots, so they are safe to reuse after it).
update() later writes the sampled tokens over the placeholders. The next plan's decode entries
carry the placeholder, which the backend replaces with the token it sampled on the device.

With ignore_eos and no stop tokens the schedule is the same as the plain Scheduler's; a request
that stops on EOS is in the next step already, which computes one token that is thrown away.
A request preempted while its token is pending waits at the head of the queue until it lands.
Any policy runs overlapped: this class only overrides hooks of the plain Scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.plan import PLACEHOLDER, KVCacheSpec, ScheduledRequest
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.core.stopping import stop_reason

if TYPE_CHECKING:
    from engine.core.config import SchedulerConfig
    from engine.core.policies.base import Policy


class AsyncScheduler(Scheduler):
    """The plain Scheduler, booking each planned step before its tokens are known."""

    def __init__(self, config: SchedulerConfig, kv_spec: KVCacheSpec, policy: Policy,
                 enable_prefix_caching: bool = True, eos_token_id: int | None = None) -> None:
        super().__init__(config, kv_spec, policy, enable_prefix_caching, eos_token_id)
        # Booked to reach max_tokens in a planned step, blocks already freed; update() finishes them.
        self.finishing: dict[str, Request] = {}
        # Of those, the ones whose computed blocks a pending token may keep from the prefix cache
        # (keep_freed): their block table, blocks offered and the pool's num_taken when freed; the
        # blocks are offered when the token lands, as the plain Scheduler offered them at booking.
        self._freed_unoffered: dict[str, tuple[list[int], int, int]] = {}

    def abort(self, request_id: str, now: float = 0.0) -> bool:
        request = self.finishing.pop(request_id, None)
        if request is None:
            return super().abort(request_id, now)
        self._freed_unoffered.pop(request_id, None)
        self._finish(request, FinishReason.ABORTED, now)
        return True

    def next_waiting(self) -> Request | None:
        head = super().next_waiting()
        # preempted while its last token is still being sampled: it cannot be recomputed yet
        return None if head is None or head.num_pending_tokens else head

    def _register_computed(self, request: Request) -> None:
        # a block that reaches into placeholders waits until update() knows their tokens
        self.block_manager.register_computed(request, len(request.token_ids) - request.num_pending_tokens)

    def _book(self, scheduled: list[ScheduledRequest]) -> tuple[int, int]:
        counts = super()._book(scheduled)
        requests = self.requests
        leaving = False
        for entry in scheduled:
            if not entry.sample:
                continue
            request = requests[entry.request_id]
            tokens = request.token_ids
            tokens.append(PLACEHOLDER)
            request.num_pending_tokens += 1
            if len(tokens) - request.num_prompt_tokens >= request.max_tokens:  # type: ignore[operator]
                if request.num_computed_tokens // self.block_manager.block_size > request.num_registered_blocks:
                    self.keep_freed(request)
                self.block_manager.free(request)
                self.finishing[request.request_id] = request
                leaving = True
        if leaving:
            finishing = self.finishing
            self.running = [r for r in self.running if r.request_id not in finishing]
        return counts

    def _take_tokens(
        self, scheduled: list[ScheduledRequest], token_ids: list[int], now: float
    ) -> list[tuple[Request, FinishReason]]:
        """Write each sampling entry's token over its placeholder; returns the requests that stop, and why."""
        stops: list[tuple[Request, FinishReason]] = []
        requests = self.requests
        eos_token_id = self.eos_token_id
        block_size = self.block_manager.block_size
        unoffered = self._freed_unoffered  # take_freed(), without a call per sampled token
        for entry, token in zip(scheduled, token_ids):
            if not entry.sample:
                continue
            request = requests.get(entry.request_id)
            if request is None:  # aborted, or stopped on EOS in an earlier step
                continue
            tokens = request.token_ids
            index = entry.num_computed_tokens + len(entry.token_ids)
            if index >= len(tokens) or tokens[index] != PLACEHOLDER:
                continue  # a stale step of a stopped request whose id a new request took
            tokens[index] = token
            request.num_pending_tokens -= 1
            if request.first_token_time is None:
                request.first_token_time = now
            reason = stop_reason(request, index - request.num_prompt_tokens + 1, token, eos_token_id)
            freed = unoffered.pop(request.request_id, None) if unoffered else None
            if reason is None:
                # The token just written may complete a computed block that _book() could not hash.
                if freed is not None:
                    self.offer_freed(request, freed, len(tokens) - request.num_pending_tokens)
                elif request.num_computed_tokens // block_size > request.num_registered_blocks and request.block_table:
                    self._register_computed(request)
            else:
                self._settle_stop(request, index)
                stops.append((request, reason))
        return stops

    def keep_freed(self, request: Request) -> None:
        """Before a request booked to finish frees its blocks while a pending token holds computed
        ones back from the prefix cache (the plain Scheduler offered them as it booked the step):
        keep its table, for offer_freed() once the token lands."""
        manager = self.block_manager
        if manager.enable_prefix_caching:
            self._freed_unoffered[request.request_id] = (
                request.block_table, request.num_registered_blocks, manager.num_taken)

    def take_freed(self, request_id: str) -> tuple[list[int], int, int] | None:
        return self._freed_unoffered.pop(request_id, None) if self._freed_unoffered else None

    def offer_freed(self, request: Request, freed: tuple[list[int], int, int], num_known_tokens: int) -> None:
        table, offered, taken = freed
        manager = self.block_manager
        if manager.num_taken == taken:  # else a block may hold another request's tokens by now
            manager.register_freed(request, table, offered, num_known_tokens)

    def _settle_stop(self, request: Request, index: int) -> None:
        """Take a request that stops with its token at index out of the queues, and drop what was
        booked after that token, so that _finish() sees it as if it had stopped unplanned."""
        if self.finishing.pop(request.request_id, None) is None and request.status is RequestStatus.WAITING:
            self.waiting.remove_request(request)  # preempted while its token was pending
        tokens = request.token_ids
        if len(tokens) > index + 1:
            del tokens[index + 1:]  # a later step's placeholder: its token is dropped
            request.num_computed_tokens = min(request.num_computed_tokens, index + 1)
        request.num_pending_tokens = 0
