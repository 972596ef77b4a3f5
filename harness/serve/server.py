"""Build a server from a run's config, run it with uvicorn, and tabulate what it served.

serve() runs in the calling thread until SIGINT/SIGTERM (or handle.stop()); ServerThread runs one in
a background thread (tests, scripts). Either way the outcome is the same RunOutcome as a run's,
written by harness.run.write_outcome: requests.csv holds every request the server took (aborted
ones with finish_reason "aborted"), steps.csv.gz every step, summary.csv one row (workload "http").
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Generator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvicorn

from engine.core import make_scheduler
from engine.core.loop import RunResult, WallClock
from harness.config import RunConfig
from harness.labels import run_identity
from harness.output.metrics import requests_frame, steps_frame, summarize
from harness.output.summary import FitCounts, RunLabels
from harness.run import RunOutcome, make_executor
from harness.serve.app import Server, create_app
from harness.serve.config import ServeConfig
from harness.serve.core import PacedClock, ServeCore
from harness.serve.metrics import ServerMetrics
from harness.serve.text import load_codec

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, on uvloop's event loop where it is installed (the serve extra brings it, with
    httptools, which uvicorn picks itself): callbacks and socket writes cost less per streamed token."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class _Uvicorn(uvicorn.Server):
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


def build_server(rc: RunConfig, config: ServeConfig, loop: asyncio.AbstractEventLoop) -> Server:
    executor = make_executor(rc)
    info = executor.info()
    scheduler = make_scheduler(rc.scheduler, info, rc.cache)
    clock = WallClock() if rc.backend == "engine" else PacedClock(config.time_scale)
    core = ServeCore(scheduler, executor, clock, config.max_queue, loop)
    tokenizer = config.tokenizer if config.tokenizer is not None or rc.backend == "sim" else rc.engine.model
    identity = run_identity(rc)
    name = config.served_model_name or identity["model"]
    return Server(core, load_codec(rc.backend, tokenizer), config, name, tuple(info.eos_token_ids[1:]),
                  ServerMetrics(core, name))


def outcome(server: Server, rc: RunConfig, wall_s: float) -> RunOutcome:
    core = server.core
    result = core.replica.result
    served = RunResult(result.requests + core.aborted, result.steps, dict(result.rejected), core.clock.now())
    requests, steps = requests_frame(served), steps_frame(served)
    labels = RunLabels(backend=rc.backend, **{**run_identity(rc), "workload": "http"},
                       num_submitted=len(served.requests), num_rejected=0,
                       fit=FitCounts(len(served.requests), 0, 0), wall_s=wall_s)
    summary = summarize(requests, steps, served.makespan_s, core.num_blocks, labels)
    return RunOutcome(requests, steps, summary, core.num_blocks)


async def serve_async(rc: RunConfig, config: ServeConfig, on_ready: Callable[[int], None] | None = None,
                      stop: asyncio.Event | None = None) -> tuple[RunOutcome, int | None]:
    """Serve until a signal (returned with the outcome) or stop is set; on_ready gets the bound port."""
    server = build_server(rc, config, asyncio.get_running_loop())
    uv = _Uvicorn(uvicorn.Config(create_app(server), host=config.host, port=config.port,
                                 log_level=config.log_level, lifespan="off", timeout_graceful_shutdown=5))
    started = time.perf_counter()
    server.core.start()
    task = asyncio.ensure_future(uv.serve())
    try:
        while not uv.started:
            if task.done():  # the port is taken, or the like
                task.result()
                raise RuntimeError("the HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(uv.servers[0].sockets[0].getsockname()[1])
        if stop is not None:
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            uv.should_exit = True
            stopper.cancel()
        await task
    finally:
        server.core.stop()
        server.core.executor.shutdown()
    signum = uv._captured_signals[0] if getattr(uv, "_captured_signals", None) else None
    return outcome(server, rc, time.perf_counter() - started), signum


class ServerThread:
    """A server in a background thread: ServerThread(rc, config).start() -> port; stop() -> outcome."""

    def __init__(self, rc: RunConfig, config: ServeConfig) -> None:
        self.rc, self.config = rc, config
        self._ready = threading.Event()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._result: RunOutcome | None = None
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

    def stop(self, timeout_s: float = 60.0) -> RunOutcome:
        """Stop the server (again: the same outcome) and return what it served."""
        if self._thread.is_alive() and self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout_s)
        if self._result is None:
            raise RuntimeError(f"the server did not stop cleanly: {self._error!r}")
        return self._result
