"""What bounds a replica, for an elastic fleet's policy: its resources (ReplicaLimits, which a policy
sizes a fleet on) and whether it is short now (at_limit: at its admission limit; budget_bound: its
next step cannot take all it holds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

from engine.core.loop import Replica


@dataclass(frozen=True)
class ReplicaLimits:
    """A replica's resources, for a policy to size a fleet on the demand: the requests it may hold
    (max_num_seqs), the tokens its KV cache holds, and the tokens per second its steps compute at
    its full token budget when the prompts are of a given mean length (from the backend's step
    prices: harness.autoscale.capacity; None where the token budget does not bind, as on a
    disaggregated fleet's decode replicas, which compute one token a request a step)."""

    max_num_seqs: int
    kv_tokens: int
    tokens_per_s: Callable[[float], float] | None = None


def at_limit(replica: Replica) -> bool:
    """Whether requests wait on a replica that it cannot admit: its running set at max_num_seqs or
    too few free KV blocks for the next waiting request's remaining prompt. Requests that arrived
    during a step wait for the next one on a replica that is not full: they do not count."""
    scheduler = replica.scheduler
    head = next(iter(scheduler.waiting), None)
    if head is None:
        return False
    if scheduler.num_running >= scheduler.config.max_num_seqs:
        return True
    blocks = scheduler.block_manager
    return blocks.num_free_blocks * blocks.block_size < head.num_prompt_tokens - head.num_computed_tokens


def budget_bound(replica: Replica) -> bool:
    """Whether a replica's next step cannot take all it holds: what its running requests still
    compute and the prompts waiting (in its scheduler or routed to it) exceed max_num_batched_tokens,
    the bound of a replica whose prompt tokens are its binding resource, which may hold few requests
    at once and so never reach at_limit."""
    scheduler = replica.scheduler
    budget = scheduler.config.max_num_batched_tokens
    # a running request past its prompt computes one token a step, however its booked decode run
    # (engine.core.fast_forward) stands between two of the fleet's events
    for request in scheduler.running:
        budget -= max(1, request.num_prompt_tokens - request.num_computed_tokens)
        if budget < 0:
            return True
    for request in chain(scheduler.waiting, replica.inbox):
        budget -= request.num_tokens - request.num_computed_tokens
        if budget < 0:
            return True
    return False
