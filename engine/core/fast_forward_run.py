"""A fast-forwarded run's life (engine.core.fast_forward): it starts after a decode step, books
decode steps up to the replica's horizon and waits there, open, for the replica's next tick.

At that tick the replica admits what arrived; where the policy then plans a step of waiting
requests alone (Policy.prefill_apart, nano's prefill steps), the run plans it with the scheduler
and runs it with the executor as the step-by-step path does (it reads and changes no request of
the booked batch), and the prefilled requests join the batch; otherwise, while the policy plans
the same batch again, the run books on. Anything else (a step that lacks blocks, a policy that
would plan another step, a request that could stop on a token, a reader of the requests' state:
Replica.settle) closes the run: each request's tokens and counters are written out, and an
overlapped run's booked step in flight becomes a planned step in flight, as the step-by-step path
leaves them.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from engine.core.fast_forward_parts import Flight, Member, sample, settle, truncate
from engine.core.fast_forward_steps import Booking
from engine.core.kv_reads import step_repeated_reads
from engine.core.plan import PLACEHOLDER, ScheduledRequest, StepPlan, StepResult, StepStats
from engine.core.request import Request
from engine.core.step_log import StepRecord, StepRun

if TYPE_CHECKING:
    from engine.core.executor import PendingStep
    from engine.core.fast_forward import DecodeRunner
    from engine.core.loop import Replica


class FastRun(Booking):
    """A run started after plan, the decode step the replica just ran (plain) or submitted
    (overlapped); advance() books it."""

    def __init__(self, replica: Replica, plan: StepPlan, runner: DecodeRunner, unsampled: int | None) -> None:
        super().__init__(replica, runner)
        self.base_step = plan.stats.step
        self.inserted = 0  # steps the scheduler planned into the run (prefills)
        self.use_cuda_graphs = plan.use_cuda_graphs
        self.unsampled = unsampled  # the executor's EOS, never sampled
        # admitted by prefills, to join at the next booked step: (request, whether the prefill is in flight)
        self.joining: list[tuple[Request, bool]] = []
        self.landing: list[Member] = []  # overlapped: members whose prefill is in flight
        written = 0 if self.overlap else 1  # overlapped: the template's token is still pending
        for request, entry in zip(self.scheduler.running, plan.scheduled):
            self.join(request, entry, 1, request.num_computed_tokens + written, False)
        sample(self.runner, self.batch)
        self.stats, self.plan = plan.stats, plan
        self.arrays = runner.decode_run_prices(plan, 1, 0) is not None
        self.pending: PendingStep | None = None
        if self.overlap:
            assert replica.in_flight is not None, "an overlapped decode step is in flight"
            self.pending = replica.in_flight[1]
            self.previous = self.pending.result().duration_s
            self.flight = Flight(plan.stats, self.previous, list(self.batch))
            replica.in_flight = None  # the run holds it, booked

    # ---- booking -------------------------------------------------------------------------------

    def resume(self) -> bool:
        """The replica's tick: admit what has arrived, then advance()."""
        replica = self.replica
        inbox = replica.inbox
        if inbox and replica.sees(self.t):
            replica.admit(self.t)
        if replica.horizon() <= self.t:
            # the fleet allows no booked step now (a disaggregated fleet whose requests wait for a
            # decode replica: any step's end may let one in): the step-by-step path plans it
            self.close()
            return False
        return self.advance()

    def advance(self) -> bool:
        """Book up to the horizon and wait there (True), or close where only a planned step can
        follow (False)."""
        replica, scheduler = self.replica, self.scheduler
        horizon = replica.horizon()
        while True:
            if self.t >= horizon:
                self.suspend()
                return True
            if scheduler.waiting:
                self.sync_step()
                prefill = scheduler.schedule_prefill(self.t)
                if prefill is not None:
                    self.insert(prefill)
                    if replica.plan_time() > self.t:
                        # its launches outlast the step before it: the loop plans the next step
                        # later (Replica.plan_time), as the step-by-step path does
                        self.close()
                        return False
                    continue
            if not scheduler.running or not scheduler.policy.repeats_decode(scheduler) or not self.join_pending():
                self.close()
                return False
            if self.stats is not None and self.stats.num_waiting != len(scheduler.waiting):
                self.stats = None  # admitted, waiting: a batch at max_num_seqs decodes on
            if self.stats is None and not self.restat():
                self.close()
                return False
            landing = self.overlap and self.flight is None  # a prefill is in flight: it lands after a step
            if landing:
                assert replica.in_flight is not None
                self.previous = replica.in_flight[1].result().duration_s
            planned_at, step = self.t, self.step
            outcome = self.segment(horizon, self.land if landing else None)
            if landing and replica.in_flight is not None:  # the segment booked one step or none
                self.land(planned_at, step < self.step)
            if outcome == "blocks":
                self.close()
                return False

    def insert(self, prefill: StepPlan) -> None:
        """Run a prefill step the scheduler planned (it changes no member's request), as the
        step-by-step path runs it; the requests it admitted join the batch at the next step."""
        replica, runner, executor = self.replica, self.runner, self.replica.executor
        self.flush()
        now = self.t
        replica.clock.wait_until(now)
        if not self.overlap:
            replica.complete(prefill, executor.execute(prefill), now)
        else:
            self.joining = [(request, False) for request, _ in self.joining]  # the prefill in flight lands now
            flight = self.flight
            if flight is None:
                submitted = executor.submit(prefill)
                replica.finish_in_flight()
            else:  # the booked step in flight completes as this one is submitted
                assert self.pending is not None
                pending = runner.resubmitted(self.pending, StepResult([], flight.duration))
                submitted = executor.submit(prefill)
                pending.result()
                replica.clock.advance(flight.duration)
                self.complete_flight(replica.clock.now())
                self.flush()
            replica.in_flight = (prefill, submitted, now)
        self.inserted += 1
        self.t = replica.clock.now()
        running = self.scheduler.running
        self.joining += [(request, self.overlap) for request in running[len(self.batch) + len(self.joining):]]
        self.stats = None

    def join_pending(self) -> bool:
        """The requests the prefills admitted join the batch (False: one cannot be booked)."""
        if not self.joining:
            return True
        eos = self.scheduler.eos_token_id
        eos_stops = eos is not None and eos != self.unsampled
        for request, _ in self.joining:
            params = request.sampling_params
            if params.stop_token_ids or (eos_stops and not params.ignore_eos) or \
                    len(request.token_ids) - request.num_computed_tokens != 1:
                return False
        first = self.step + 1
        joined: list[Member] = []
        for request, in_flight in self.joining:
            offset = request.num_computed_tokens - first + 1
            entry = ScheduledRequest(request.request_id, [PLACEHOLDER], offset - 1, request.block_table, True,
                                     request.sampling_params, offset - request.num_prompt_tokens, True,
                                     request.prefix_key)
            member = self.join(request, entry, first, request.num_computed_tokens + 1, in_flight)
            (self.landing if in_flight else joined).append(member)
        sample(self.runner, joined)  # (the landing ones once their prefill lands: it writes their first token)
        self.joining = []
        return True

    def restat(self) -> bool:
        """Stats and prices of a new batch (False: the step-by-step path would not plan it whole)."""
        scheduler, bs, n = self.scheduler, self.bs, len(self.batch)
        if n > scheduler.config.max_num_batched_tokens:
            return False
        entries = [m.entry for m in self.batch]
        repeated, decode_repeated = step_repeated_reads(entries, self.bm, n)
        self.stats = StepStats(self.base_step + self.inserted, "decode", n, 0, n, len(scheduler.waiting), n, 0, 0, 0,
                               repeated * bs, decode_repeated * bs)
        self.plan = StepPlan(entries, self.stats, [], [], self.use_cuda_graphs)
        return True

    def land(self, planned_at: float, booked: bool) -> None:
        """Overlapped: the prefill in flight completes once the next step is planned (booked), as
        the step-by-step path has it: its requests' part of that step is booked on them first."""
        replica = self.replica
        assert replica.in_flight is not None
        if not booked:  # nothing planned: it stays in flight, unread
            plan, pending, at = replica.in_flight
            replica.in_flight = (plan, self.runner.resubmitted(pending, pending.result()), at)
            return
        landing, self.landing = self.landing, []
        for member in landing:
            request = member.request
            request.num_computed_tokens += 1
            request.token_ids.append(PLACEHOLDER)
            request.num_pending_tokens += 1
        self.flush()
        replica.clock.wait_until(planned_at)
        replica.finish_in_flight()
        sample(self.runner, landing)

    # ---- waiting and closing -------------------------------------------------------------------

    def sync_step(self) -> None:
        self.scheduler._step = self.base_step + 1 + self.step + self.inserted

    def suspend(self) -> None:
        self.sync_step()
        self.replica.clock.wait_until(self.t)
        self.flush()

    def flush(self) -> None:
        """Hand the replica the steps booked so far, the requests they finished settled."""
        if self.finished:
            members, self.finished = self.finished, []
            settle(members, [m.last for m in members])
        record = self.replica.record_steps
        for group in self.groups:
            durations = group.durations
            if len(durations) == 1:
                item: StepRecord | StepRun = StepRecord(group.starts[0], durations[0], group.stats)
            else:
                item = StepRun(group.stats, array("d", group.starts), array("d", durations),
                               array("q", group.free_blocks))
            record(item, [m.request for m in group.finished])
        self.groups = []

    def close(self) -> None:
        """Write out each member's tokens and counters as the step-by-step path has them now; an
        overlapped run's booked step in flight becomes a planned one."""
        replica, steps = self.replica, self.step
        self.sync_step()
        flight = self.flight
        if flight is not None:  # overlapped: its members' last tokens are pending
            members = flight.members
            truncate(members, steps)
            entries, tokens = [], []
            for member in members:
                request = member.request
                tokens.append(request.token_ids[-1])
                request.token_ids[-1] = PLACEHOLDER
                request.num_pending_tokens = 1
                end = member.offset + steps
                entries.append(ScheduledRequest(request.request_id, [PLACEHOLDER], end - 1, request.block_table, True,
                                                request.sampling_params, end - request.num_prompt_tokens, True,
                                                request.prefix_key))
            assert self.pending is not None
            plan = StepPlan(entries, flight.stats, [], [], self.use_cuda_graphs)
            replica.in_flight = (plan, self.runner.resubmitted(self.pending, StepResult(tokens, flight.duration)),
                                 self.t)
        else:
            members = self.batch
            truncate(members, steps)
            if self.overlap:
                for member in members:
                    if member.offset + steps > member.start:  # (not a landing one: its prefill is in flight)
                        member.request.num_pending_tokens = 0  # their last booked step completed
        settle(members, [min(steps, m.last) for m in members])
        self.flush()
        replica.clock.wait_until(self.t)
        replica.fast = None

