"""vLLM V1's policy: one token budget per step, shared by decodes and prefill chunks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.plan import ScheduledRequest
from engine.core.policies.base import POLICIES, Policy, admits_none

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler


@POLICIES.register("mixed")
class MixedPolicy(Policy):
    """Running requests go first, oldest first, each taking what it still has to compute (one
    token for a decode, the rest of a prompt, up to the budget). One that cannot get blocks
    preempts the youngest running request. Then, if nobody was preempted, waiting requests are
    admitted from the queue's head with their cached prefix, the last one chunked to fit the
    budget. Blocks are taken chunk by chunk, not for the whole prompt up front.
    """

    def repeats_decode(self, scheduler: Scheduler) -> bool:
        return admits_none(scheduler)

    def build_step(self, scheduler: Scheduler) -> list[ScheduledRequest]:
        cfg = scheduler.config
        bm = scheduler.block_manager
        scheduled, budget = scheduler.schedule_running(cfg.max_num_batched_tokens)
        if scheduler.preempted and scheduled:
            return scheduled  # NOTE: admitting now would only feed the next preemption
        running = scheduler.running
        while scheduler.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            request = scheduler.next_waiting()
            if request is None:
                break
            hits = bm.lookup(request)
            cached = len(hits) * bm.block_size
            num_new = request.num_tokens - cached
            if num_new > budget:
                if not cfg.enable_chunked_prefill:
                    break
                num_new = budget
            if not bm.can_allocate(request, cached + num_new, hits):
                break
            scheduler.admit(request, hits, cached + num_new)
            scheduler.start_running(request)
            scheduled.append(scheduler.entry(request, num_new, False))
            budget -= num_new
        return scheduled
