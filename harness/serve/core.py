"""The HTTP process's handle on the core process (harness.serve.core_loop).

HTTP handlers never touch the scheduler that runs. They hand a request over (submit) or ask for one
to go (abort); each is a message the core process takes between steps. After each step it sends
every live request's new tokens in one message, which this side hands to the requests' sinks in
one pass on the asyncio loop (harness.serve.passes). Admission is checked here, before a request is sent, by a scheduler
built from the same config and cache size (check_fits reads only those).

Times cross as perf_counter() values: a delivery's `due` is when its tokens were scheduled for (the
simulator's paced time, or the engine's step end). The simulator's steps arrive ahead of their time
and wait on the loop's timer, so at that time the HTTP side need not wait for the core process to
wake, build and send them. How late they reach the HTTP side (`lags`)
and a stream's socket (`send_lags`) is kept as one sample per token, for the latest LAG_SAMPLES
tokens (a server that runs for hours keeps a bounded window).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass

import pandas as pd

from engine.core import BackendInfo, make_scheduler
from engine.core.request import FinishReason, Request
from engine.core.scheduler import Scheduler
from harness.config import RunConfig
from harness.serve.delivery import Delivery, Prepare, Sink
from harness.serve.passes import LAG_SAMPLES, CoreSnapshot, StepPasses
from harness.serve.wire import WireProtocol

__all__ = ["CoreResult", "CoreSnapshot", "CoreStopped", "Delivery", "QueueFull", "ServeCore"]

class QueueFull(Exception):
    """serve.max_queue requests are already waiting or running."""


class CoreStopped(Exception):
    """The core process is gone (its error is in the message); nothing more can be served."""


@dataclass
class CoreResult:
    """What the core process served, as a run's tables (harness.output.metrics)."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    makespan_s: float
    handoff_s: list[float]  # per step with tokens: the core process's time to build and send them


class ServeCore(StepPasses):
    """start() spawns the core process and waits until it is ready; stop() ends it and returns its
    tables. Everything else is called on the asyncio loop."""

    def __init__(self, rc: RunConfig, time_scale: float, max_queue: int, max_early_s: float = 0.0,
                 early_tokens: bool = True) -> None:
        super().__init__()
        self.rc = rc
        self.time_scale = time_scale
        self.max_queue = max_queue
        # with several HTTP processes max_queue is this one's share (build.make_server says so here)
        self.queue_full = f"the server holds serve.max_queue={max_queue} requests"
        self.max_early_s = max_early_s
        self.early_tokens = early_tokens  # the engine's token thread (harness.serve.handoff)
        self.send_lags: deque[float] = deque(maxlen=LAG_SAMPLES)  # ... when a stream wrote it, per token
        self.tokens_sent = 0  # every token handed to a socket (send_lags keeps the latest)
        self.error: str | None = None
        self.origin = 0.0  # perf_counter() time 0 of the core's clock
        self._wire: WireProtocol | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._waiting: asyncio.Future | None = None  # the ready or result message
        self._owner = True  # this front started the core process (start), not attach
        self.closing = False  # the server is stopping (close): no request is taken

    # ---- lifetime ---------------------------------------------------------------------------

    async def start(self, fronts: int = 1) -> list[socket.socket]:
        """Spawn `python -m harness.serve.core_loop` and wait until its executor is built. A
        configuration the backend refuses raises ValueError or TypeError with its message. With
        fronts > 1 (serve.api_servers) the core process gets a socket pair per HTTP process: the
        other fronts' ends are returned, for them to attach()."""
        pairs = [socket.socketpair() for _ in range(fronts)]
        theirs = [pair[1] for pair in pairs]
        try:
            fds = [sock.fileno() for sock in theirs]
            self._proc = subprocess.Popen([sys.executable, "-m", "harness.serve.core_loop", *map(str, fds)],
                                          pass_fds=fds)
        finally:
            for sock in theirs:
                sock.close()
        spare = [pair[0] for pair in pairs[1:]]
        try:
            await self._connect(pairs[0][0])
            self._wire.send(("config", self.rc, self.time_scale, self.early_tokens))  # type: ignore[union-attr]
            await self._until_ready()
        except BaseException:
            for sock in spare:
                sock.close()
            raise
        return spare

    async def attach(self, sock: socket.socket) -> None:
        """Serve through a core process another front started (start's returned socket): wait for
        its ready message. stop() then only detaches; the starting front stops the core."""
        self._owner = False
        await self._connect(sock)
        await self._until_ready()

    async def _connect(self, sock: socket.socket) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._waiting = loop.create_future()  # before the socket is read: the ready message may be there already
        _, self._wire = await loop.create_unix_connection(lambda: WireProtocol(self._on_message, self._on_lost),
                                                          sock=sock)

    async def _until_ready(self) -> None:
        assert self._waiting is not None
        info, self.origin = await self._waiting
        self.info: BackendInfo = info
        self.num_blocks = info.num_blocks
        # the admission rule's own object: reads only the config and the cache size
        self.admission: Scheduler = make_scheduler(self.rc.scheduler, info, self.rc.cache)

    async def stop(self) -> CoreResult | None:
        """Abort what is left, end the core process and return what it served (None if it died)."""
        result = None
        if not self._owner:  # the core process's requests from here are aborted when this side closes
            self._end_streams()
            if self._wire is not None and self._wire.transport is not None:
                self._wire.transport.close()
            return None
        if self.alive and self._wire is not None and self._loop is not None:
            self._waiting = self._loop.create_future()
            self._wire.send(("stop",))
            try:
                result = await self._waiting
            except RuntimeError:
                result = None
        if self._proc is not None:
            await asyncio.to_thread(self._proc.wait)
        if self._wire is not None and self._wire.transport is not None:
            self._wire.transport.close()
        return result

    @property
    def alive(self) -> bool:
        if not self._owner:
            return self._wire is not None and self._wire.transport is not None \
                and not self._wire.transport.is_closing() and self.error is None
        return self._proc is not None and self._proc.poll() is None and self.error is None

    # ---- from the HTTP side ------------------------------------------------------------------

    def submit(self, request: Request, sink: Sink, prepare: Prepare | None = None) -> None:
        """Queue request (its max_tokens already checked by the admission rule), arriving now.
        prepare, if given, is offered each of its deliveries in a step that arrives ahead."""
        if self.closing:
            raise CoreStopped("the server is shutting down")
        if len(self._sinks) >= self.max_queue:
            raise QueueFull(f"{self.queue_full}; retry later")
        if not self.alive or self._wire is None:
            raise CoreStopped(f"the core process is not running: {self.error}")
        stamp = time.perf_counter()
        request.arrival_time = stamp - self.origin
        self._sinks[request.request_id] = sink
        if prepare is not None:
            self._prepares[request.request_id] = prepare
        self.snapshot.live = len(self._sinks)
        self._wire.send(("add", request, stamp))

    def close(self) -> None:
        """The server is stopping: take no more requests, abort those in flight in the core and
        end their streams now (finish_reason "abort"), so that no response holds the shutdown."""
        self.closing = True
        if self._wire is not None:
            for request_id in self._sinks:
                self._wire.send(("abort", request_id))
        self._end_streams()

    def abort(self, request_id: str) -> None:
        self._prepares.pop(request_id, None)
        if self._sinks.pop(request_id, None) is not None and self._wire is not None:
            self.snapshot.live = len(self._sinks)
            self._wire.send(("abort", request_id))

    def sent(self, taken: list[tuple[float, int]], now: float) -> None:
        """A stream handed the tokens of these (due, count) deliveries to its socket at now."""
        for due, count in taken:
            self.send_lags.extend([now - due] * count)
            self.tokens_sent += count

    # ---- from the core process -------------------------------------------------------------

    def _on_message(self, message: tuple) -> None:
        kind = message[0]
        if kind == "tokens":  # a step's tokens, ahead of its "step" (harness.serve.handoff)
            # at once, past held steps: with early tokens a step carries only finishes (test_handoff pins it)
            self._pass([message])
        elif kind == "step":
            self._hold(message)
        elif kind == "snap":
            self._snap(message[1])
        elif kind == "ready":
            self._resolve((message[1], message[2]))
        elif kind == "result":
            self._release(everything=True)
            self._resolve(CoreResult(*message[1:]))
        else:  # "error"
            self._failed(message[1], message[2])

    def _resolve(self, value: object) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(value)

    def _failed(self, kind: str, text: str) -> None:
        self.error = f"{kind}: {text}"
        error_type = {"ValueError": ValueError, "TypeError": TypeError}.get(kind, RuntimeError)
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(error_type(text))
        self._end_streams()

    def _on_lost(self, exc: Exception | None) -> None:
        if self.error is None and (self._waiting is None or not self._waiting.done()):
            self._failed("RuntimeError", f"the core process exited ({exc or 'its socket closed'})")
        self._end_streams()

    def _end_streams(self) -> None:
        """Requests in flight end as aborted: their streams close rather than hang."""
        now = time.perf_counter()
        sinks, self._sinks = self._sinks, {}
        self._prepares = {}
        for sink in sinks.values():
            sink(Delivery([], FinishReason.ABORTED, now))
        self.snapshot.live = 0
