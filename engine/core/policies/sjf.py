"""Shortest job first: the mixed policy's token-budget batching, admitting short prompts first.

The waiting queue is ordered by the prompt tokens a request has to compute (its prompt length;
what the prefix cache will save is not known until the request is admitted), fewest first, and
in arrival order among equals. Short prompts then wait less behind long ones, which lowers the
mean time to first token; a long prompt can wait for as long as shorter ones keep arriving.

NOTE: a preempted request goes back to the front of the queue, ahead of every request that has
not started, as in FCFS (vLLM does the same). It was admitted before them and has produced
tokens; sorting it among them by its now longer recompute would hold it back behind every
shorter arrival, with its output half done.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from engine.core.policies.base import POLICIES, RequestQueue
from engine.core.policies.mixed import MixedPolicy
from engine.core.request import Request


class ShortestFirstQueue:
    """Preempted requests first (in the order they were put back), then the rest by prompt length."""

    def __init__(self) -> None:
        self._preempted: deque[Request] = deque()
        self._heap: list[tuple[int, int, Request]] = []  # (prompt tokens, arrival number, request)
        self._arrivals = itertools.count()

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.num_prompt_tokens, next(self._arrivals), request))

    def prepend_request(self, request: Request) -> None:
        self._preempted.appendleft(request)

    def peek_request(self) -> Request:
        return self._preempted[0] if self._preempted else self._heap[0][2]

    def pop_request(self) -> Request:
        return self._preempted.popleft() if self._preempted else heapq.heappop(self._heap)[2]

    def remove_request(self, request: Request) -> None:
        if request in self._preempted:
            self._preempted.remove(request)
            return
        index = next(i for i, item in enumerate(self._heap) if item[2] is request)
        self._heap[index] = self._heap[-1]
        self._heap.pop()
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._preempted) + len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        yield from self._preempted
        for item in sorted(self._heap):
            yield item[2]


@POLICIES.register("sjf")
class ShortestJobFirstPolicy(MixedPolicy):
    """MixedPolicy's batching over a ShortestFirstQueue."""

    def make_queue(self) -> RequestQueue:
        return ShortestFirstQueue()
