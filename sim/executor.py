"""The simulated executor: prices each step with a cost model and makes up deterministic tokens.

A sampled token is a hash of (seed, request id, position), so two requests never produce the same
text by accident (prefix caching of generated text is not faked into hits), a preempted request
regenerates the same tokens when recomputed, and a run is reproducible. The end-of-sequence token
is never drawn: a simulator cannot know when a model would stop, so output lengths come from
max_tokens (the workload's).

When its BackendInfo says overlaps_steps (ExecutionConfig.async_scheduling), the core loop plans
each step before the previous one's tokens are read, as the engine does on CUDA; submit() prices
the step at once and hands it back completed. A step submitted while no other is in flight (after
an idle gap, or when every runnable request waited on the step before), and every step executed
one at a time, is priced after cost_model.drained(): nothing runs before it to hide its launches.
Such a submitted step also waits idle_start_s (SimConfig.idle_start, the hardware's
idle_start_host_s) before its device work: the loop's planning, the device clock's anchor and the
batch's building that the engine does before an idle device's first kernel and hides behind the
step in flight otherwise. The step's duration holds it (an engine step's span starts after it).

With SimConfig.kv_scatter a disaggregated decode replica tells its executor of each request whose
KV landed (landed(); engine.core.disagg.DecodeReplica.arrived): the engine writes it from the
receive staging into the paged cache on the compute stream, before the next step, so the next step
(submitted or executed) takes that write longer: scatter_base_s + its prompt tokens x
scatter_token_s each.

With SimConfig.power_curve the executor times its steps on the device's line (sim.power_limit) and
sets the cost model's power_scale before each price, a fast-forwarded run's repeats included
(decode_prices): a GPU at its power limit slows with the prefill it has just run.

With SimConfig.plan_after_launches a submitted step also carries host_s, the host time of its
submit() as the cost model priced it (its launches, ProfiledCostModel.last_launch_s; 0 for a cost
model without them, and without the setting): the core loop plans the next step only once that
returned (engine.core.loop.Replica.plan_time).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import xxhash

from engine.core.executor import BackendInfo, PendingStep, StepHook, StepHooks, Unobserve
from engine.core.plan import ScheduledRequest, StepPlan, StepResult
from engine.core.request import TokenIds
from sim.power_limit import Clock, PowerCurve, PowerLimit
from sim.sampled import PositionLanes, SampledTokens, hash_runs_packed, hash_tokens, position_bytes
from sim.sampled import request_seed as request_seed_of

if TYPE_CHECKING:
    from sim.cost_model import CostModel


class SimExecutor:
    def __init__(self, cost_model: CostModel, info: BackendInfo, seed: int = 0, fast_forward: bool = True,
                 samples: SampledTokens | None = None, idle_start_s: float = 0.0,
                 plan_after_launches: bool = False, scatter: tuple[float, float] = (0.0, 0.0),
                 power: PowerCurve | None = None) -> None:
        """idle_start_s: host time a step submitted with nothing in flight waits before its device
        work (module docstring). samples: tokens computed ahead (sim.sampled; a plan's, shared by its
        deployments), read where they cover what a step samples, if they are of this seed, vocabulary and eos (the
        same tokens either way: others are hashed here). plan_after_launches: submitted steps carry
        their host_s (module docstring; False: 0, the loop plans at once). scatter: (base seconds,
        seconds per token) of writing a landed request's KV into the cache (module docstring).
        power: the GPU's slowing at its power limit (sim.power_limit; needs a cost model with a
        power_scale, the profiled one), timed on the clock follow_clock() gives."""
        vocab_size = info.vocab_size
        eos_token_id = info.eos_token_id
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2, got {vocab_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
        if eos_token_id is not None and not 0 <= eos_token_id < vocab_size:
            raise ValueError(f"eos_token_id must be in [0, vocab_size={vocab_size}) or None, got {eos_token_id!r}")
        if isinstance(idle_start_s, bool) or not isinstance(idle_start_s, (int, float)) or not idle_start_s >= 0:
            raise ValueError(f"idle_start_s must be a number >= 0, got {idle_start_s!r}")
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0 for x in scatter):
            raise ValueError(f"scatter must be (base_s, token_s), numbers >= 0, got {scatter!r}")
        if power is not None and not hasattr(cost_model, "power_scale"):
            raise ValueError(f"a power curve scales a profiled model's device work: "
                             f"{type(cost_model).__name__} has none")
        self.cost_model = cost_model
        self._power = None if power is None else PowerLimit(power)
        self.idle_start_s = float(idle_start_s)
        self.scatter_base_s, self.scatter_token_s = map(float, scatter)
        self._scatter_s = 0.0  # device time of the landings since the last step, paid by the next
        self.plan_after_launches = plan_after_launches
        self.seed = seed
        self._info = info
        self._vocab_size = vocab_size
        self._eos_token_id = eos_token_id
        self._lanes = PositionLanes()  # the seedless part of each position's hash, kept across runs
        self._request_seeds: dict[str, int] = {}  # per-request hash seed, dropped when released
        self._hooks = StepHooks()
        self._unread = 0  # submitted steps whose result the loop has not read yet
        self.fast_forward = fast_forward  # engine.core.fast_forward books runs of decode steps at once
        suited = samples is not None and samples.suits(seed, vocab_size, eos_token_id)
        self._ahead = samples.tokens if samples is not None and suited else {}

    def info(self) -> BackendInfo:
        return self._info

    def execute(self, plan: StepPlan) -> StepResult:
        self.cost_model.drained()
        return self._hooks.executed(plan, self._price_landed)

    def landed(self, num_tokens: int) -> None:
        """A request's KV of num_tokens landed: its write into the cache goes before the next step."""
        if self.scatter_base_s or self.scatter_token_s:
            self._scatter_s += self.scatter_base_s + num_tokens * self.scatter_token_s

    def follow_clock(self, clock: Clock) -> None:
        """The loop's clock, which a power curve times an idle device's next step on (sim.power_limit)."""
        if self._power is not None:
            self._power.clock = clock

    def _price_landed(self, plan: StepPlan, idle_s: float = 0.0) -> StepResult:
        """The step, after the landed requests' writes into the cache (landed()) and idle_s of host
        work before its device work."""
        result = self._price(plan)
        if self._scatter_s:
            result = replace(result, duration_s=result.duration_s + self._scatter_s)
            self._scatter_s = 0.0
        if idle_s:
            result = replace(result, duration_s=result.duration_s + idle_s)
        if self._power is not None:
            self._power.ran(result.duration_s, plan.stats.num_prefill_tokens)
        return result

    def submit(self, plan: StepPlan) -> PendingStep:
        """A simulated step is priced when submitted; the loop reads it one step later."""
        idle = not self._unread
        if idle:
            self.cost_model.drained()
        self._unread += 1
        return self._hooks.submitted(plan, self._submit_idle if idle and self.idle_start_s else self._submit)

    def _submit(self, plan: StepPlan) -> _Priced:
        result = self._price_landed(plan)
        return _Priced(result, self, self._host_s())

    def _submit_idle(self, plan: StepPlan) -> _Priced:
        """A step onto an idle device: its host work before the first kernel, then the step. The cost
        model keeps the step's device price as its state (what the next step hides behind)."""
        return _Priced(self._price_landed(plan, self.idle_start_s), self, self._host_s())

    def _host_s(self) -> float:
        """The host time of the submit() of the step just priced: its launches (module docstring)."""
        return getattr(self.cost_model, "last_launch_s", 0.0) if self.plan_after_launches else 0.0

    def observe(self, hook: StepHook) -> Unobserve:
        return self._hooks.add(hook)

    def hold_device(self, seconds: float) -> bool:
        return False  # no device queue to hold

    def _price(self, plan: StepPlan) -> StepResult:
        seeds = self._request_seeds
        for request_id in plan.released_ids:
            seeds.pop(request_id, None)
        vocab = self._vocab_size
        eos = self._eos_token_id
        ahead = self._ahead
        hash_int = xxhash.xxh64_intdigest
        tokens: list[int] = []
        append = tokens.append
        for entry in plan.scheduled:
            if not entry.sample:
                append(0)
                continue
            request_id = entry.request_id
            # The token sampled this step lands at index context_len of the request's token ids.
            position = entry.num_computed_tokens + len(entry.token_ids)
            if ahead:
                known = ahead.get(request_id)
                if known is not None and 0 <= position - known[0] < len(known[1]):
                    append(known[1][position - known[0]])
                    continue
            request_seed = seeds.get(request_id)
            if request_seed is None:
                request_seed = seeds[request_id] = hash_int(request_id.encode(), self.seed)
            token = hash_int(position_bytes(position), request_seed) % vocab
            if token == eos:
                token = (token + 1) % vocab
            append(token)
        return StepResult(tokens, self._step_time(plan))

    def _step_time(self, plan: StepPlan) -> float:
        power = self._power
        if power is None:
            return self.cost_model.step_time(plan)
        model = self.cost_model
        model.power_scale = power.scale_for(plan.stats.num_prefill_tokens)  # type: ignore[attr-defined]
        try:
            return model.step_time(plan)
        finally:
            model.power_scale = 1.0  # type: ignore[attr-defined]

    # ---- fast-forward (engine.core.fast_forward.DecodeRunner) ------------------------------------

    def fast_forwards(self) -> bool:
        """Runs of decode steps may be booked at once: fast-forward is on and no hook watches the steps."""
        return self.fast_forward and not self._hooks.watched

    def decode_run_prices(self, plan: StepPlan, first: int, count: int) -> list[float] | None:
        """The prices of plan's repeats first .. first + count - 1, from a cost model that prices
        them so (decode_run_prices: one without state, which drained() leaves as it is); None
        otherwise."""
        prices = getattr(self.cost_model, "decode_run_prices", None)
        return None if prices is None else prices(plan, first, count)

    def decode_prices(self, plan: StepPlan) -> Iterator[float]:
        """The prices of plan's repeats, as execute() (drained before each) or submit() (one in
        flight) would give them."""
        cost_model = self.cost_model
        repeats = getattr(cost_model, "decode_repeats", None)
        prices: Iterator[float] = repeats(plan) if repeats is not None else _repeat_plans(cost_model, plan)
        # steps executed one at a time are each priced after drained(), as execute() does
        prices = prices if self._info.overlaps_steps else _drained_before(cost_model, prices)
        return prices if self._power is None else self._power.repeats(prices, cost_model)

    def sample_tokens(self, request_id: str, first_position: int, count: int) -> list[int]:
        known = self._known(request_id, first_position, count)
        if known is not None:
            return known
        return hash_tokens(self._seed_of(request_id), first_position, count, self._vocab_size, self._eos_token_id)

    def sample_runs(self, runs: Sequence[tuple[str, int, int]]) -> list[TokenIds]:
        """sample_tokens for each (request_id, first_position, count), the same values: those
        computed ahead read, the others hashed together (sim.sampled.hash_runs)."""
        out: list[TokenIds | None] = [self._known(*run) for run in runs] if self._ahead else [None] * len(runs)
        missing = [i for i, tokens in enumerate(out) if tokens is None]
        if missing:
            seeded = [(self._seed_of(runs[i][0]), runs[i][1], runs[i][2]) for i in missing]
            for i, tokens in zip(missing, hash_runs_packed(seeded, self._vocab_size, self._eos_token_id, self._lanes)):
                out[i] = tokens
        return out  # type: ignore[return-value]  # every None was filled

    def _known(self, request_id: str, first_position: int, count: int) -> list[int] | None:
        """The tokens at these positions from those computed ahead, None where they do not cover them."""
        known = self._ahead.get(request_id)
        if known is None:
            return None
        start = first_position - known[0]
        return known[1][start : start + count] if start >= 0 and start + count <= len(known[1]) else None

    def _seed_of(self, request_id: str) -> int:
        seeds = self._request_seeds
        request_seed = seeds.get(request_id)
        if request_seed is None:
            request_seed = seeds[request_id] = request_seed_of(request_id, self.seed)
        return request_seed

    def resubmitted(self, pending: PendingStep, result: StepResult) -> PendingStep:
        """The in-flight step (read by the caller) replaced by one priced to result."""
        self._unread += 1
        return _Priced(result, self, getattr(pending, "host_s", 0.0))

    def shutdown(self) -> None:
        self._request_seeds.clear()

    def _read(self) -> None:
        self._unread -= 1


def _drained_before(cost_model: CostModel, prices: Iterator[float]) -> Iterator[float]:
    """prices, with cost_model.drained() called before each is computed (steps run one at a time)."""
    while True:
        cost_model.drained()
        yield next(prices)


def _repeat_plans(cost_model: CostModel, plan: StepPlan) -> Iterator[float]:
    """Prices of plan's repeats from a plan built for each (a cost model without decode_repeats)."""
    stats = plan.stats
    for j in itertools.count(1):
        entries = [ScheduledRequest(e.request_id, e.token_ids, e.num_computed_tokens + j, e.block_table, e.sample,
                                    e.sampling_params, e.num_output_tokens + j, e.is_decode, e.prefix_key)
                   for e in plan.scheduled]
        yield cost_model.step_time(StepPlan(entries, replace(stats, step=stats.step + j), [], [],
                                            plan.use_cuda_graphs))


class _Priced:
    """A priced step handed back by submit(); reading it takes it out of flight (once). host_s: the
    host time of the submit() that queued it (module docstring)."""

    __slots__ = ("_result", "_executor", "host_s")

    def __init__(self, result: StepResult, executor: SimExecutor, host_s: float = 0.0) -> None:
        self._result = result
        self._executor: SimExecutor | None = executor
        self.host_s = host_s

    def result(self) -> StepResult:
        if self._executor is not None:
            self._executor._read()
            self._executor = None
        return self._result
