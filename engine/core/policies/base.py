"""What a scheduling policy is, the registry of policies, and the first-come-first-served queue.

A policy decides two things (vLLM V1 has the same split): the order of the waiting queue
(make_queue) and how one step's batch is assembled from the waiting and running queues
(build_step), with the mechanism the Scheduler offers policies (next_waiting, admit, entry,
schedule_running, start_running). Everything else (admission checks, booking computed tokens,
appending sampled ones, finishing, overlapped steps) is the Scheduler's and the same for all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from engine.core.plan import ScheduledRequest
from engine.core.registry import Registry
from engine.core.request import Request

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler


class RequestQueue(Protocol):
    """The waiting queue. Iterating it gives the requests in the order they would be admitted."""

    def add_request(self, request: Request) -> None:
        """Queue a new request."""

    def prepend_request(self, request: Request) -> None:
        """Queue a preempted request, which is to be recomputed."""

    def peek_request(self) -> Request:
        """The request to admit next (the queue is not empty)."""
        ...

    def pop_request(self) -> Request:
        """Remove and return the request peek_request() gives."""
        ...

    def remove_request(self, request: Request) -> None:
        """Remove a queued request (aborted, or stopped while preempted)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Request]: ...


class FcfsQueue(deque[Request]):
    """First come, first served; a preempted request goes back to the front."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def peek_request(self) -> Request:
        return self[0]

    def pop_request(self) -> Request:
        return self.popleft()

    def remove_request(self, request: Request) -> None:
        self.remove(request)


class Policy(ABC):
    """How the waiting queue is ordered and a step's batch assembled. Stateless: one Scheduler
    holds one, and every step it plans comes from build_step."""

    def make_queue(self) -> RequestQueue:
        """A new, empty waiting queue in this policy's order (FCFS unless a policy says otherwise)."""
        return FcfsQueue()

    @abstractmethod
    def build_step(self, scheduler: Scheduler) -> list[ScheduledRequest]:
        """Plan one step: allocate blocks, move requests between the queues, return the entries."""

    def repeats_decode(self, scheduler: Scheduler) -> bool:
        """Whether, having just planned a step in which every running request decodes, this policy
        plans that same batch again until a request arrives, finishes or lacks a block (engine.core.
        fast_forward books such runs at once). False unless a policy knows: no fast-forward."""
        return False

    def prefill_apart(self, scheduler: Scheduler) -> list[ScheduledRequest]:
        """The entries of the next step, admitted and allocated as build_step() would, if it is a
        step of waiting requests alone that reads and changes no running request; [] with nothing
        changed otherwise (then build_step() plans the step). [] unless a policy knows: a booked
        run of decode steps (engine.core.fast_forward) then ends at each arrival."""
        return []


def admits_none(scheduler: Scheduler) -> bool:
    """No waiting request can join the running batch: none waits, or the batch is at max_num_seqs."""
    return not scheduler.waiting or len(scheduler.running) >= scheduler.config.max_num_seqs


POLICIES: Registry[type[Policy]] = Registry("scheduler.policy")
