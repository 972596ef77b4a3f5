"""Scheduling policies: how one step's batch is assembled from the waiting and running queues.

make_scheduler() puts a policy together with the bookkeeping the backend's steps need: the plain
Scheduler's, or AsyncScheduler's when the backend overlaps steps.
"""

from __future__ import annotations

from engine.core.async_scheduler import AsyncScheduler
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.executor import BackendInfo
from engine.core.plan import ScheduledRequest
from engine.core.request import RequestStatus
from engine.core.scheduler import Scheduler


class NanoScheduler(Scheduler):
    """nano-vllm's policy: a step is all prefill or all decode, and prefill goes first.

    Prefill admits FCFS while the token budget, max_num_seqs and free blocks allow, charging only
    uncached tokens. Blocks for the whole prompt are taken at admission. Only the first request of
    a step may be chunked; a chunked request stays at the head of the waiting queue (holding its
    blocks) until its last chunk, then joins the running queue.
    If nothing is admitted, every running request decodes one token; one that needs a block when
    none is free preempts the youngest running request (itself, if it is the youngest).
    """

    def _build_step(self) -> list[ScheduledRequest]:
        scheduled = self._prefill()
        if scheduled:
            return scheduled
        scheduled = self._decode()
        if not scheduled and self._preempted:
            # The last runner preempted itself; its freed blocks let the queue head in now.
            scheduled = self._prefill()
        return scheduled

    def _prefill(self) -> list[ScheduledRequest]:
        cfg = self.config
        bm = self.block_manager
        budget = cfg.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        while self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
            request = self._next_waiting()
            if request is None:
                break
            fresh = not request.block_table
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
                self._admit(request, hits, request.num_tokens)
            num_new = min(remaining, budget)
            budget -= num_new
            scheduled.append(self._entry(request, num_new, False))
            if num_new < remaining:
                break  # a chunked prompt ends the prefill batch
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
        return scheduled

    def _decode(self) -> list[ScheduledRequest]:
        # Every running request here has its whole prompt computed: one token each.
        scheduled, _ = self._schedule_running(self.config.max_num_batched_tokens)
        return scheduled


class MixedScheduler(Scheduler):
    """vLLM V1's policy: one token budget per step, shared by decodes and prefill chunks.

    Running requests go first, oldest first, each taking what it still has to compute (one token
    for a decode, the rest of a prompt, up to the budget). One that cannot get blocks preempts
    the youngest running request. Then, if nobody was preempted, waiting requests are admitted
    FCFS with their cached prefix, the last one chunked to fit the budget. Blocks are taken
    chunk by chunk, not for the whole prompt up front.
    """

    def _build_step(self) -> list[ScheduledRequest]:
        cfg = self.config
        bm = self.block_manager
        scheduled, budget = self._schedule_running(cfg.max_num_batched_tokens)
        running = self.running
        if self._preempted and scheduled:
            return scheduled  # NOTE: admitting now would only feed the next preemption
        while self.waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            request = self._next_waiting()
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
            self._admit(request, hits, cached + num_new)
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            running.append(request)
            scheduled.append(self._entry(request, num_new, False))
            budget -= num_new
        return scheduled


class AsyncNanoScheduler(AsyncScheduler, NanoScheduler):
    pass


class AsyncMixedScheduler(AsyncScheduler, MixedScheduler):
    pass


POLICY_CLASSES: dict[str, type[Scheduler]] = {"nano": NanoScheduler, "mixed": MixedScheduler}
OVERLAPPED_POLICY_CLASSES: dict[str, type[Scheduler]] = {"nano": AsyncNanoScheduler, "mixed": AsyncMixedScheduler}


def make_scheduler(config: SchedulerConfig, info: BackendInfo, cache_config: CacheConfig | None = None) -> Scheduler:
    """The scheduler of config.policy for a backend described by info (its cache, its primary EOS
    id, whether its steps overlap)."""
    classes = OVERLAPPED_POLICY_CLASSES if info.overlaps_steps else POLICY_CLASSES
    prefix = True if cache_config is None else cache_config.enable_prefix_caching
    return classes[config.policy](config, info.kv_cache_spec, prefix, info.eos_token_id)
