"""What a run keeps of its finished requests and of its steps when it keeps no objects: a
column per field (a few dozen bytes a request), so a run's memory follows the requests in flight.

RequestRecords holds what requests.csv needs of each finished request, with the order it was
submitted in; StepTotals holds what the summary needs of the steps (their count and two sums).
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.core.request import Request


def _time(value: float | None) -> float:
    return math.nan if value is None else value


@dataclass
class RequestRecords:
    """Finished requests' fields, one column each, in the order they were added."""

    order: array[int] = field(default_factory=lambda: array("q"))  # the request's submission index
    request_id: list[str] = field(default_factory=list)
    arrival: array[float] = field(default_factory=lambda: array("d"))
    first_scheduled: array[float] = field(default_factory=lambda: array("d"))
    first_token: array[float] = field(default_factory=lambda: array("d"))
    finish: array[float] = field(default_factory=lambda: array("d"))
    prompt_tokens: array[int] = field(default_factory=lambda: array("q"))
    output_tokens: array[int] = field(default_factory=lambda: array("q"))
    preemptions: array[int] = field(default_factory=lambda: array("q"))
    cached_tokens: array[int] = field(default_factory=lambda: array("q"))
    recomputed_tokens: array[int] = field(default_factory=lambda: array("q"))
    finish_reason: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.order)

    def add(self, request: Request, order: int) -> None:
        self.order.append(order)
        self.request_id.append(request.request_id)
        self.arrival.append(request.arrival_time)
        self.first_scheduled.append(_time(request.first_scheduled_time))
        self.first_token.append(_time(request.first_token_time))
        self.finish.append(_time(request.finish_time))
        self.prompt_tokens.append(request.num_prompt_tokens)
        self.output_tokens.append(request.num_output_tokens)
        self.preemptions.append(request.num_preemptions)
        self.cached_tokens.append(request.num_cached_tokens)
        self.recomputed_tokens.append(request.num_recomputed_tokens)
        self.finish_reason.append(request.finish_reason.value if request.finish_reason else "")


@dataclass
class StepTotals:
    """A run's steps, summed: how many, their prefill tokens and their requests."""

    count: int = 0
    prefill_tokens: int = 0
    requests: int = 0


class ArrivalFeed(deque[Request]):
    """An inbox that reads the next arrival from an iterator as the previous one is taken: it
    holds the first request not yet admitted (the loop reads its time), never more."""

    def __init__(self, source: Iterator[Request], submitted: dict[str, int]) -> None:
        super().__init__()
        self._source = source
        self._submitted = submitted
        self._count = 0
        self._last = -math.inf
        self._pull()

    def _pull(self) -> None:
        request = next(self._source, None)
        if request is None:
            return
        if request.arrival_time < self._last:
            raise ValueError(f"run(compact=True) needs requests in arrival order: request {request.request_id} "
                             f"arrives at {request.arrival_time} s, after one at {self._last} s")
        self._last = request.arrival_time
        self._submitted[request.request_id] = self._count
        self._count += 1
        self.append(request)

    def popleft(self) -> Request:
        request = super().popleft()
        if not self:
            self._pull()
        return request
