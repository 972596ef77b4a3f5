"""A replica that runs its own loop in another process, as vLLM's data-parallel engine cores do,
and what the routing process keeps of it.

The replica process owns an engine.core.loop.Replica (its scheduler, built for its executor, so
overlapped steps run exactly as in a single run) and serves it with serve_replica(). The routing
process (engine.core.fleet.run_fleet_wall) only routes arrivals, sends them on, and reads reports.
Messages are (kind, payload) pairs on one duplex connection per replica:

  router -> replica   ("requests", [Request, ...])  routed to it, in arrival order
                      ("end", None)                 nothing more will arrive: finish, then say "done"
                      ("shutdown", None)            stop now (the run failed elsewhere, or is over)
  replica -> router   ("report", Report)            after each iteration that stepped or rejected
                      ("done", makespan_s)          after "end", once nothing is left to serve;
                                                    makespan_s: when its last iteration ended

Both processes read one clock (engine.core.loop.WallClock with the router's origin), so the
StepRecords and request timestamps a replica reports need no conversion.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from engine.core.launch_log import LaunchLog, LaunchRow
from engine.core.loop import Replica, RunResult, StepLog, StepRecord, tokens_left
from engine.core.request import Request


@dataclass(slots=True)
class Report:
    """What one replica iteration produced, and the replica's load right after it."""

    steps: list[StepRecord]
    finished: list[Request]  # with their tokens and timestamps
    rejected: dict[str, str]  # request id -> admission error
    num_received: int  # requests taken off the connection so far: the load below covers them
    outstanding_tokens: int  # Replica.outstanding_tokens() when the report was made
    # the LaunchRows of these steps where the replica keeps a LaunchLog (None: it keeps none)
    launches: list[LaunchRow] | None = None


class Connection(Protocol):
    """The replica's end of its duplex connection: multiprocessing's Connection, or a stand-in."""

    def poll(self) -> bool: ...

    def recv(self) -> Any: ...

    def send(self, obj: Any) -> None: ...


def serve_replica(replica: Replica, conn: Connection, launches: LaunchLog | None = None) -> bool:
    """Serve the requests that arrive on conn (a multiprocessing Connection, or anything with its
    poll/recv/send) until "end" has come and nothing is left, then send ("done", makespan_s) and
    return False; return True at once on "shutdown".

    NOTE: with work in hand the connection is polled between iterations without blocking, so
    arrivals join the next step; idle, it blocks on the next message. launches: the LaunchLog
    watching the replica's executor, whose rows go with the reports of their steps."""
    received = 0
    ending = False
    makespan = 0.0  # when its last iteration ended, as a simulated replica's clock stops there
    while True:
        busy = replica.next_event_time() < math.inf
        if not busy and ending:
            conn.send(("done", makespan))
            return False
        for kind, payload in _messages(conn, block=not busy):
            if kind == "requests":
                replica.inbox.extend(payload)
                received += len(payload)
            elif kind == "end":
                ending = True
            elif kind == "shutdown":
                return True
            else:
                raise ValueError(f"replica {replica.index}: unknown message {kind!r}")
        makespan = step_and_report(replica, conn, received, makespan, launches)


def _messages(conn: Connection, block: bool) -> Iterator[Any]:
    if block:
        yield conn.recv()
    while conn.poll():
        yield conn.recv()


def step_and_report(replica: Replica, conn: Connection, received: int, makespan: float,
                    launches: LaunchLog | None = None) -> float:
    """Run the replica's next event, if it has one, and send what it produced since the last
    report; returns when its last iteration ended (makespan where it had nothing to run)."""
    if replica.next_event_time() < math.inf:
        replica.tick()
        makespan = replica.clock.now()
    report = take_report(replica, received, launches)
    if report is not None:
        conn.send(("report", report))
    return makespan


def take_report(replica: Replica, received: int, launches: LaunchLog | None = None) -> Report | None:
    """What the replica produced since the last report (handed over, not kept), or None. The
    LaunchLog's rows are its steps': the executor calls it as a step's result is taken, in the
    iteration that records the step."""
    result = replica.result
    if not (result.steps or result.requests or result.rejected):
        return None
    replica.result = RunResult(requests=[], steps=StepLog())
    return Report(list(result.steps), result.requests, result.rejected, received, replica.outstanding_tokens(),
                  None if launches is None else launches.take())


def keep_launches(report: Report, result: RunResult) -> None:
    """The router's side: a report's LaunchRows added to its replica's RunResult.launches."""
    if report.launches is not None:
        if result.launches is None:
            result.launches = []
        result.launches.extend(report.launches)


class ReplicaView:
    """The router's view of a replica in another process (an engine.core.routers.ReplicaLoad):
    what a proxy in front of it can know. Requests count from dispatch until reported finished or
    rejected; tokens are the replica's latest report plus every request dispatched after it."""

    def __init__(self) -> None:
        self._open = 0  # dispatched, not yet reported finished or rejected
        self._reported_tokens = 0
        self._num_covered = 0  # dispatched requests the latest report's load covers
        self._uncovered: deque[Request] = deque()  # dispatched after them, in dispatch order

    def dispatched(self, request: Request) -> None:
        self._open += 1
        self._uncovered.append(request)

    def reported(self, report: Report) -> None:
        self._open -= len(report.finished) + len(report.rejected)
        while self._num_covered < report.num_received:
            self._uncovered.popleft()
            self._num_covered += 1
        self._reported_tokens = report.outstanding_tokens

    def outstanding_requests(self) -> int:
        return self._open

    def outstanding_tokens(self) -> int:
        return self._reported_tokens + sum(map(tokens_left, self._uncovered))
