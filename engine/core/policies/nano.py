"""nano-vllm's policy: a step is all prefill or all decode, and prefill goes first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.plan import ScheduledRequest
from engine.core.policies.base import POLICIES, Policy, admits_none

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler


@POLICIES.register("nano")
class NanoPolicy(Policy):
    """Prefill admits from the queue's head while the token budget, max_num_seqs and free blocks
    allow, charging only uncached tokens. Blocks for the whole prompt are taken at admission. Only
    the first request of a step may be chunked; a chunked request stays at the head of the waiting
    queue (holding its blocks) until its last chunk, then joins the running queue.
    If nothing is admitted, every running request decodes one token; one that needs a block when
    none is free preempts the youngest running request (itself, if it is the youngest).
    """

    def repeats_decode(self, scheduler: Scheduler) -> bool:
        return admits_none(scheduler)

    def prefill_apart(self, scheduler: Scheduler) -> list[ScheduledRequest]:
        # a prefill step holds waiting requests only; _prefill changes nothing when it admits none
        return self._prefill(scheduler)

    def build_step(self, scheduler: Scheduler) -> list[ScheduledRequest]:
        scheduled = self._prefill(scheduler)
        if scheduled:
            return scheduled
        # decode: every running request has its whole prompt computed, one token each
        scheduled, _ = scheduler.schedule_running(scheduler.config.max_num_batched_tokens)
        if not scheduled and scheduler.preempted:
            # The last runner preempted itself; its freed blocks let the queue head in now.
            scheduled = self._prefill(scheduler)
        return scheduled

    def _prefill(self, scheduler: Scheduler) -> list[ScheduledRequest]:
        cfg = scheduler.config
        bm = scheduler.block_manager
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        while scheduler.waiting and len(scheduler.running) < cfg.max_num_seqs and budget > 0:
            request = scheduler.next_waiting()
            if request is None:
                break
            fresh = not request.block_table
            hits: list[int] = []
            if fresh:
                hits = bm.lookup(request)
                if not bm.can_allocate(request, request.num_tokens, hits):
                    break
                remaining = request.num_tokens - len(hits) * bm.block_size
            else:
                remaining = request.num_tokens - request.num_computed_tokens
            if remaining > budget and (scheduled or not cfg.enable_chunked_prefill):
                break
            if fresh:
                scheduler.admit(request, hits, request.num_tokens)
            num_new = min(remaining, budget)
            budget -= num_new
            scheduled.append(scheduler.entry(request, num_new, False))
            if num_new < remaining:
                break  # a chunked prompt ends the prefill batch
            scheduler.start_running(request)
        return scheduled
