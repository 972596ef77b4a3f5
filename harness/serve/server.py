"""Build a server from a run's config, run it with uvicorn, and tabulate what it served.

serve_async() runs until SIGINT/SIGTERM (or its stop event); ServerThread runs one in a background
thread (tests, scripts). The scheduler and the executor run in a core process of their own
(harness.serve.core_loop), started before uvicorn listens and stopped after it. Either way the
outcome is a run's (harness.run.write_outcome): requests.csv holds every request the server took
(aborted ones with finish_reason "aborted") with the HTTP side's times (harness.serve.overhead),
steps.csv.gz every step, summary.csv one row (workload "http"); ServeOutcome.overhead is the
one-row serve_overhead.csv.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pandas as pd
import uvicorn

from harness.config import RunConfig
from harness.labels import run_identity
from harness.output.metrics import summarize
from harness.output.summary import FitCounts, RunLabels
from harness.run import RunOutcome
from harness.serve.app import Server, create_app
from harness.serve.board import MetricsBoard
from harness.serve.build import make_server, run_event_loop
from harness.serve.config import ServeConfig
from harness.serve.core import CoreResult
from harness.serve.draining import DrainingServer
from harness.serve.front import Fronts, listening_socket
from harness.serve.metrics import row_width
from harness.serve.overhead import overhead_summary, with_http_times
from harness.serve.passes import LAG_SAMPLES


class _Uvicorn(DrainingServer):
    """uvicorn's server, but a signal only asks it to stop: the caller writes the outcome, then
    exits with the signal's status (uvicorn would raise the signal again, killing it first)."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


@dataclass
class ServeOutcome(RunOutcome):
    overhead: pd.DataFrame = field(default_factory=pd.DataFrame)  # serve_overhead.csv's one row


def outcome(server: Server, rc: RunConfig, wall_s: float, result: CoreResult | None,
            http_cpu_s: float = float("nan")) -> ServeOutcome:
    core = server.core
    if result is None:
        raise RuntimeError(f"the core process gave no outcome: {core.error}")
    requests = with_http_times(result.requests, server.times, core.origin, core.time_scale)
    labels = RunLabels(backend=rc.backend, **{**run_identity(rc), "workload": "http"},
                       num_submitted=len(requests), num_rejected=0,
                       fit=FitCounts(len(requests), 0, 0), wall_s=wall_s)
    summary = summarize(requests, result.steps, result.makespan_s, core.num_blocks, labels)
    return ServeOutcome(requests, result.steps, summary, core.num_blocks,
                        overhead=overhead_summary(requests, core.lags, core.send_lags, result.handoff_s,
                                                  core.time_scale, http_cpu_s, server.config.api_servers,
                                                  core.tokens_sent))


async def serve_async(rc: RunConfig, config: ServeConfig, on_ready: Callable[[int], None] | None = None,
                      stop: asyncio.Event | None = None) -> tuple[ServeOutcome, int | None]:
    """Serve until a signal (returned with the outcome) or stop is set; on_ready gets the bound port.
    With serve.api_servers > 1 the other HTTP processes start first and stop first (harness.serve.front)."""
    # bound before the core process starts: a port in use (or a host that does not resolve) is an
    # OSError at once, not once the model has loaded, and never uvicorn's own log line and exit
    sock = listening_socket(config.host, config.port, first=True, shared=config.api_servers > 1)
    board = MetricsBoard.create(config.api_servers, row_width()) if config.api_servers > 1 else None
    try:
        server, spare = await make_server(rc, config, board=board)
    except BaseException:
        sock.close()
        if board is not None:
            board.close()
        raise
    others = Fronts(board)
    started = time.perf_counter()
    result = None
    http_cpu_s = 0.0  # the HTTP processes' CPU while they listened
    try:
        if board is not None:
            await others.start(("config", rc, config, sock.getsockname()[1]), spare)
        gc.freeze()  # the imported stack is never garbage: collections need not scan it while serving
        uv = _Uvicorn(uvicorn.Config(create_app(server), log_level=config.log_level, lifespan="off",
                                     timeout_graceful_shutdown=5), server.core.close)
        task = asyncio.ensure_future(uv.serve(sockets=[sock]))
        while not uv.started:
            if task.done():  # uvicorn could not start
                task.result()
                raise RuntimeError("the HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(uv.servers[0].sockets[0].getsockname()[1])
        cpu = time.thread_time()  # this loop's thread runs this process's HTTP side
        if stop is not None:
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            uv.should_exit = True
            stopper.cancel()
        await task
        http_cpu_s += time.thread_time() - cpu
    finally:
        core = server.core
        # room for every process's latest LAG_SAMPLES lags
        core.lags, core.send_lags = (deque(kept, maxlen=LAG_SAMPLES * config.api_servers)
                                     for kept in (core.lags, core.send_lags))
        for part in await others.stop():
            server.times.update(part.times)
            core.lags.extend(part.lags)
            core.send_lags.extend(part.send_lags)
            core.tokens_sent += part.tokens_sent
            http_cpu_s += part.cpu_s
        sock.close()  # (uvicorn closed it, unless it never started)
        for spare_sock in spare:  # those of fronts that never started
            spare_sock.close()
        result = await server.core.stop()
        if board is not None:
            board.close()
    signum = uv._captured_signals[0] if getattr(uv, "_captured_signals", None) else None
    return outcome(server, rc, time.perf_counter() - started, result, http_cpu_s), signum


class ServerThread:
    """A server in a background thread: ServerThread(rc, config).start() -> port; stop() -> outcome."""

    def __init__(self, rc: RunConfig, config: ServeConfig) -> None:
        self.rc, self.config = rc, config
        self._ready = threading.Event()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._result: ServeOutcome | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="serve-http", daemon=True)

    def start(self, timeout_s: float = 120.0) -> int:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self.port

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._result, _ = await serve_async(self.rc, self.config, self._on_ready, self._stop)

        try:
            run_event_loop(run())
        except BaseException as error:
            self._error = error
            self._ready.set()

    def _on_ready(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def stop(self, timeout_s: float = 60.0) -> ServeOutcome:
        """Stop the server (again: the same outcome) and return what it served."""
        if self._thread.is_alive() and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)
        if self._result is None:
            raise RuntimeError(f"the server did not stop cleanly: {self._error!r}")
        return self._result
