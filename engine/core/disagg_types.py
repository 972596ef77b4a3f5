"""What a disaggregated fleet's event loop (engine.core.disagg_events) prices and returns: the
transfer pricer it is given, each request's transfer, and the fleet's result."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from engine.core.loop import RunResult
from engine.core.request import Request


class TransferPricer(Protocol):
    def price(self, num_tokens: int, prefill: int, decode: int, overlap_s: float) -> tuple[float, int]:
        """(seconds the transfer adds after overlap_s seconds of prefill it may overlap, bytes) for
        the KV of num_tokens tokens from prefill replica `prefill` to decode replica `decode`."""
        ...


@dataclass(slots=True)
class Transfer:
    prefill: int
    decode: int = -1
    ready_s: float = 0.0  # the first token: the KV is complete
    start_s: float = math.nan  # decode blocks reserved, transfer under way
    transfer_s: float = math.nan  # start to landing
    bytes: int = 0


@dataclass
class DisaggResult:
    requests: list[Request]  # every finished request, in submission order
    prefill: list[RunResult]  # per prefill replica: its steps, its prefill copies, its rejections
    decode: list[RunResult]  # per decode replica: its steps, the requests it finished
    transfers: dict[str, Transfer] = field(default_factory=dict)  # request id -> where it went
    rejected: dict[str, str] = field(default_factory=dict)
    makespan_s: float = 0.0
    max_blocked: int = 0  # most requests waiting for a decode replica at once
