"""The scheduler: queues, admission checks, step bookkeeping. Its policy decides the batch.

schedule() asks the policy (engine/core/policies) for a step's batch and counts its tokens as
computed; update() appends the tokens the backend sampled and finishes requests on length, EOS or
a stop token (engine.core.stopping), freeing their blocks. The policy also orders the waiting
queue. The methods under "for policies" are the mechanism a policy builds a batch with. engine.core.async_scheduler
overrides a few hooks for overlapped steps, where the next step is planned before this one's
tokens are known.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.admission import fitted_max_tokens
from engine.core.block_manager import BlockManager
from engine.core.kv_reads import step_repeated_reads
from engine.core.plan import KVCacheSpec, ScheduledRequest, StepPlan, StepResult, StepStats, step_kind
from engine.core.request import FinishReason, Request, RequestStatus
from engine.core.stopping import stop_reason

if TYPE_CHECKING:
    from engine.core.config import SchedulerConfig
    from engine.core.policies.base import Policy


class Scheduler:
    """Queues and bookkeeping of one replica; `policy` assembles each step's batch."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_spec: KVCacheSpec,
        policy: Policy,
        enable_prefix_caching: bool = True,
        eos_token_id: int | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.block_manager = BlockManager(kv_spec.num_blocks, kv_spec.block_size, enable_prefix_caching)
        self.eos_token_id = eos_token_id
        self.waiting = policy.make_queue()
        self.running: list[Request] = []  # oldest first; preemption takes from the end
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        self.preempted: list[str] = []  # ids preempted in the step being planned
        self._released: list[str] = []
        self._step = 0
        self._hit_tokens = 0
        self._now = 0.0
        self.num_preemptions = 0

    # ---- admission ---------------------------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue a request, or raise ValueError naming what is wrong with it (nothing else changes)."""
        rid = request.request_id
        if request.status is not RequestStatus.WAITING or request.num_computed_tokens:
            raise ValueError(f"request {rid!r} was already scheduled once; submit a new Request")
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}: a request with this id is still unfinished")
        request.max_tokens = self.check_fits(request)
        self.requests[rid] = request
        self.waiting.add_request(request)

    def check_fits(self, request: Request) -> int:
        """The request's max_tokens (None resolved), or ValueError if it can never be served here.

        Reads only the configuration and the cache's size, so another thread may ask it (the HTTP
        server answers 400 before a request reaches the loop)."""
        return fitted_max_tokens(request, self.config, self.block_manager)

    def abort(self, request_id: str, now: float = 0.0) -> bool:
        """Finish a waiting or running request as ABORTED and free its blocks. False if unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove_request(request)
        self._finish(request, FinishReason.ABORTED, now)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # ---- one step ----------------------------------------------------------------------

    def schedule(self, now: float = 0.0) -> StepPlan:
        self._begin(now)
        return self._planned(self.policy.build_step(self))

    def schedule_prefill(self, now: float = 0.0) -> StepPlan | None:
        """The next step, as schedule() plans it, if the policy plans it of waiting requests alone
        (Policy.prefill_apart: no running request is in it or changes); None, with nothing
        changed, where the policy would plan another step. engine.core.fast_forward plans the
        prefills of arrivals between booked decode steps with it."""
        self._begin(now)
        scheduled = self.policy.prefill_apart(self)
        return self._planned(scheduled) if scheduled else None

    def _begin(self, now: float) -> None:
        self.preempted = []
        self._hit_tokens = 0
        self._now = now

    def _planned(self, scheduled: list[ScheduledRequest]) -> StepPlan:
        """The plan of the step the policy built: its entries booked, its stats counted."""
        # before _book(), which may free the blocks of requests this step finishes
        repeated, decode_repeated = step_repeated_reads(scheduled, self.block_manager)
        num_tokens, decode_tokens = self._book(scheduled)
        prefill_tokens = num_tokens - decode_tokens
        kind = step_kind(len(scheduled), prefill_tokens, decode_tokens)
        block_size = self.block_manager.block_size
        stats = StepStats(  # positional: a StepStats per step, and keywords cost twice the time
            self._step, kind, len(scheduled), prefill_tokens, decode_tokens, len(self.waiting), len(self.running),
            self.block_manager.num_free_blocks, len(self.preempted), self._hit_tokens, repeated * block_size,
            decode_repeated * block_size,
        )
        self._step += 1
        released, self._released = self._released, []
        return StepPlan(scheduled, stats, self.preempted, released)

    def _book(self, scheduled: list[ScheduledRequest]) -> tuple[int, int]:
        """Count a planned step's tokens as computed and offer newly full blocks to the prefix cache.
        Returns the step's tokens and its decode entries (StepStats counts them)."""
        block_size = self.block_manager.block_size
        requests = self.requests
        num_tokens = num_decodes = 0
        for entry in scheduled:
            request = requests[entry.request_id]
            start = entry.num_computed_tokens
            end = start + len(entry.token_ids)
            num_tokens += end - start
            num_decodes += entry.is_decode
            high = request.max_computed_tokens
            if start < high:
                request.num_recomputed_tokens += min(end, high) - start
            request.num_computed_tokens = end
            if end > high:
                request.max_computed_tokens = end
            if end // block_size > request.num_registered_blocks:
                self._register_computed(request)
        return num_tokens, num_decodes

    def _register_computed(self, request: Request) -> None:
        self.block_manager.register_computed(request)

    def update(self, plan: StepPlan, result: StepResult, now: float = 0.0) -> list[Request]:
        """Record a step's sampled tokens; returns the requests that finished."""
        finished: list[Request] = []
        for request, reason in self._take_tokens(plan.scheduled, result.token_ids, now):
            self._finish(request, reason, now)
            finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return finished

    def _take_tokens(
        self, scheduled: list[ScheduledRequest], token_ids: list[int], now: float
    ) -> list[tuple[Request, FinishReason]]:
        """Give each sampling entry's request its token; returns the requests that stop, and why.

        One call per step, not per token: this loop runs once per running request per step.
        """
        stops: list[tuple[Request, FinishReason]] = []
        requests = self.requests
        eos_token_id = self.eos_token_id
        for entry, token in zip(scheduled, token_ids):
            if not entry.sample:
                continue
            request = requests.get(entry.request_id)
            if request is None:  # aborted after the step was planned
                continue
            tokens = request.token_ids
            tokens.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            reason = stop_reason(request, len(tokens) - request.num_prompt_tokens, token, eos_token_id)
            if reason is not None:
                stops.append((request, reason))
        return stops

    # ---- for policies: the mechanism a batch is built with ----------------------------------

    def next_waiting(self) -> Request | None:
        """The waiting request a policy may admit next (the queue's head), None if none."""
        return self.waiting.peek_request() if self.waiting else None

    def start_running(self, request: Request) -> None:
        """Move request, the head of the waiting queue, to the end of the running queue."""
        self.waiting.pop_request()
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def schedule_running(self, budget: int) -> tuple[list[ScheduledRequest], int]:
        """Give running requests, oldest first, what they still need to compute, within budget.

        A request that cannot get blocks preempts the youngest running request, itself last.
        Returns the entries and the budget left.
        """
        bm = self.block_manager
        block_size = bm.block_size
        running = self.running
        scheduled: list[ScheduledRequest] = []
        # A preemption pops from the end of running, which this iteration then never reaches.
        for request in running:
            if budget <= 0:
                break
            tokens = request.token_ids
            num_tokens = len(tokens)
            computed = request.num_computed_tokens
            num_new = num_tokens - computed
            if num_new > budget:
                num_new = budget
            target = computed + num_new
            # NOTE: most decode steps need no new block; skip the allocator for them (hot path).
            if len(request.block_table) * block_size < target:
                while not bm.can_allocate(request, target):
                    victim = running.pop()
                    self._preempt(victim)
                    if victim is request:
                        return scheduled, budget
                bm.allocate(request, target)
            # A running request with only its last sampled token to compute is decoding; one finishing a
            # (re)prefill in chunks is not, unless only its last token is left, which costs the same.
            prompt_len = request.num_prompt_tokens
            scheduled.append(ScheduledRequest(
                request.request_id, tokens[computed:target], computed, request.block_table,
                target == num_tokens, request.sampling_params, num_tokens - prompt_len,
                num_new == 1 and num_tokens > prompt_len, request.prefix_key,
            ))  # inlined entry(): this loop runs once per running request per step
            budget -= num_new
        return scheduled, budget

    def entry(self, request: Request, num_new_tokens: int, is_decode: bool) -> ScheduledRequest:
        """The plan's entry for request computing its next num_new_tokens tokens."""
        start = request.num_computed_tokens
        end = start + num_new_tokens
        num_tokens = len(request.token_ids)
        return ScheduledRequest(
            request.request_id,
            request.token_ids[start:end],
            start,
            request.block_table,
            end == num_tokens,
            request.sampling_params,
            num_tokens - request.num_prompt_tokens,
            is_decode,
            request.prefix_key,
        )

    def admit(self, request: Request, hits: list[int], num_tokens: int) -> None:
        """Give a waiting request its cached prefix and blocks for num_tokens."""
        bm = self.block_manager
        bm.record_lookup(request, len(hits))
        bm.allocate(request, num_tokens, hits)
        if request.prefix_key is None:
            request.prefix_key = bm.prefix_key(request)
        cached = len(hits) * bm.block_size
        request.num_computed_tokens = cached
        request.num_cached_tokens += cached
        self._hit_tokens += cached
        if request.first_scheduled_time is None:
            request.first_scheduled_time = self._now

    def _preempt(self, request: Request) -> None:
        """Drop the request's KV and send it back to the waiting queue (FCFS: its front) to be recomputed."""
        self.block_manager.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)
        self.preempted.append(request.request_id)

    def _finish(self, request: Request, reason: FinishReason, now: float) -> None:
        self.block_manager.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.finish_time = now
        del self.requests[request.request_id]
        self._released.append(request.request_id)
