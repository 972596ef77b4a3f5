"""Overlapped steps in the server: each step's tokens go to the HTTP process as soon as they exist.

With overlapped steps (info().overlaps_steps) the loop submits step N+1 before it reads step N's
tokens (engine.core.loop.Replica.tick), and submitting a step can hold the host long after step N
is done: an eager prefill of thousands of tokens is tens of milliseconds of kernel launches, and
step N, a decode, takes a few. Sent by the loop, step N's tokens would wait for that submission
(experiments/serve/h200_run2/README.md: 10 ms mean when a prefill follows). Instead a thread of the
core process waits for each submitted step's sampled ids (EarlyTokens.sampled(): a CUDA event wait,
which releases the GIL) and sends them at once in a "tokens" message. The loop, when it reads the
step itself, sends the rest: finish reasons and the gauges. Steps are submitted and read in the
same order as a run's, so the overlap is the run's.

Which entries' tokens may go early is decided by the loop, after the previous step's update: an
entry that samples, of a request the scheduler still holds, whose placeholder is still there (the
rule of engine.core.async_scheduler.AsyncScheduler._take_tokens). The update of this step then
keeps each of those tokens; a request aborted meanwhile is dropped by the HTTP side as before.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING

from engine.core.plan import PLACEHOLDER

if TYPE_CHECKING:
    from engine.core.executor import EarlyTokens
    from engine.core.plan import StepPlan
    from engine.core.scheduler import Scheduler
    from harness.serve.wire import Channel

# while the loop launches a step in Python, the sender waits at most this long for the GIL
SWITCH_INTERVAL_S = 2e-4


class Watch:
    """One submitted step: (entry index, request id, cached prompt tokens) of the entries whose
    token may go early; `sent` is filled with the request ids sent once `done` is set."""

    __slots__ = ("pending", "rows", "done", "sent")

    def __init__(self, pending: EarlyTokens, rows: list[tuple[int, str, int]]) -> None:
        self.pending = pending
        self.rows = rows
        self.done = threading.Event()
        self.sent: list[str] = []


def early_rows(plan: StepPlan, scheduler: Scheduler) -> list[tuple[int, str, int]]:
    """The entries of a submitted step whose token its update will keep (module docstring)."""
    rows = []
    requests = scheduler.requests
    for i, entry in enumerate(plan.scheduled):
        if not entry.sample:
            continue
        request = requests.get(entry.request_id)
        if request is None:
            continue
        tokens = request.token_ids
        index = entry.num_computed_tokens + len(entry.token_ids)
        if index < len(tokens) and tokens[index] == PLACEHOLDER:
            rows.append((i, entry.request_id, request.num_cached_tokens))
    return rows


class TokenSender:
    """The thread that sends each watched step's tokens (module docstring); close() ends it."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._queue: queue.SimpleQueue[Watch | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="token-sender", daemon=True)
        self._thread.start()

    def watch(self, pending: EarlyTokens, rows: list[tuple[int, str, int]]) -> Watch:
        watch = Watch(pending, rows)
        self._queue.put(watch)
        return watch

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (watch := self._queue.get()) is not None:
            try:
                tokens = watch.pending.sampled()
                deliveries = [(rid, [tokens[i]], None, cached) for i, rid, cached in watch.rows]
                if deliveries and not self.channel.closed:
                    self.channel.send(("tokens", time.perf_counter(), deliveries))
                    watch.sent = [rid for rid, *_ in deliveries]
            except BaseException:  # noqa: BLE001 - the loop's own result() raises it; it sends the tokens then
                watch.sent = []
            finally:
                watch.done.set()
