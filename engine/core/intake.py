"""A multi-process fleet's request intake: how long after its arrival a replica's loop sees a request.

The engine's fleets run each replica's loop in its own process (engine.replicas: data-parallel
replicas, an elastic fleet's, a disaggregated fleet's prefill replicas): the router routes an
arrival on the wall clock and hands it to the replica's sender thread, which pickles it down the
replica's pipe, and the replica's loop reads it between its steps (or wakes on it when idle). A
single run has none of it: its loop reads its own inbox. A simulated fleet prices it when given
an Intake (engine.core.loop.Replica.intake; the harness reads the measured figure of the GPU host,
harness.fleet.intake): base_s + per_token_s x the prompt's tokens (the pickled prompt grows with
them). The router still routes at the arrival, and the request's TTFT still counts from it.

The router sends a replica every arrival due at once in one message, so requests routed to it at
the same arrival are seen together, their tokens summed (Replica.next_seen); a replica sees its
inbox in routing order (one pipe): a request is never seen before the one routed to it before.

An idle replica's loop waits on its pipe and sees a request as it comes. One that is stepping reads
its pipe between steps, poll_lag_s after a step's end (the wait for the step's tokens to wake, the
scheduler's update, the report to the router): a request that came by then joins the next step it
plans, the same step a simulated replica plans at that step's end. So a stepping replica sees a
request poll_lag_s sooner, counted from its own step boundaries (Replica.sees).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Intake:
    base_s: float  # a request of no tokens: the router's hand-over, the pipe, the replica's read
    per_token_s: float = 0.0  # each prompt token more (its bytes pickled, piped and unpickled)
    poll_lag_s: float = 0.0  # a stepping replica reads its pipe this long after a step's end

    def __post_init__(self) -> None:
        for name in ("base_s", "per_token_s", "poll_lag_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Intake.{name} must be a finite number of seconds >= 0, got {value!r}")

    def delay_s(self, tokens: int) -> float:
        """Seconds from a message's arrivals until the replica's loop can see them: the message
        carries their prompts' tokens."""
        return self.base_s + self.per_token_s * tokens
