"""More than one HTTP process in front of one core process (serve.api_servers, as vLLM's
--api-server-count): each serves the same routes on the same port, takes the connections the kernel
gives it (SO_REUSEPORT spreads them by their address) and streams its own requests' tokens.

Why: at hundreds of concurrent streams the HTTP side's work per token (the events, the socket
writes) needs about a core of its own (docs/serving.md#timing-200-streams-at-time_scale1); split
over N processes, each step's writes run on N cores at once.

The process started by `python -m harness.serve` (front 0) starts the core process with a socket
pair per front (ServeCore.start), then the others (`python -m harness.serve.front`, Fronts.start),
each with its end, a socket to front 0 and the shared metrics block (harness.serve.board). Over that
socket front 0 sends each its config and later "stop"; a front answers "listening", and at stop what
it served (its requests' HTTP times and its token lags), which front 0 adds to the outcome it
writes. A front ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group: front 0 decides)
and stops when front 0's socket closes.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn

from harness.serve.app import create_app
from harness.serve.board import MetricsBoard
from harness.serve.build import make_server, run_event_loop
from harness.serve.draining import DrainingServer
from harness.serve.metrics import row_width
from harness.serve.wire import WireProtocol

STOP_TIMEOUT_S = 60.0  # a front's own stop: its streams aborted, its outcome sent


def listening_socket(host: str, port: int, first: bool = False, shared: bool = True) -> socket.socket:
    """A TCP socket listening on host:port that the server's other HTTP processes may bind too
    (SO_REUSEPORT). first: the server's first, on a port nothing listens on (an SO_REUSEPORT
    socket of another program would otherwise share its connections): port 0 picks one.
    shared=False: a server of one HTTP process, which nothing else may bind."""
    if not shared:
        sock = _bound(host, port, reuse_port=False)
        sock.set_inheritable(False)
        return sock
    if first:
        probe = _bound(host, port, reuse_port=False)  # fails on a port in use, whoever holds it
        port = probe.getsockname()[1]
        probe.close()
    sock = _bound(host, port, reuse_port=True)
    sock.set_inheritable(False)
    return sock


def _bound(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        sock.close()
        raise OSError(error.errno, f"cannot listen on {host}:{port} (serve.host, serve.port): {error.strerror}") \
            from None
    return sock


class Quiet(DrainingServer):
    """uvicorn's server without signal handlers: front 0 tells a front when to stop."""

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass
class Served:
    """What a front served, for front 0's outcome."""

    times: dict
    lags: list[float]
    send_lags: list[float]
    cpu_s: float  # its event loop's CPU while it listened
    tokens_sent: int


class Fronts:
    """Front 0's handle on the other fronts: start() returns once each listens; stop() -> Served
    each. A front that exits while serving is reported, and its requests leave the live gauge (the
    core process aborts them: harness.serve.wire.FanChannel)."""

    def __init__(self, board: MetricsBoard | None = None) -> None:
        self.board = board
        self._procs: list[subprocess.Popen[bytes]] = []
        self._wires: list[WireProtocol] = []
        self._inboxes: list[asyncio.Queue[tuple]] = []
        self._watches: list[asyncio.Task[Served | None]] = []
        self._stopping = False

    async def start(self, config_message: tuple, core_socks: list[socket.socket]) -> None:
        """One process per socket in core_socks (front 1, 2, ...); RuntimeError if one exits first."""
        assert self.board is not None
        loop = asyncio.get_running_loop()
        for front, core_sock in enumerate(core_socks, start=1):
            ours, theirs = socket.socketpair()
            fds = [theirs.fileno(), core_sock.fileno(), self.board.fd]
            with theirs, core_sock:
                self._procs.append(subprocess.Popen([sys.executable, "-m", "harness.serve.front", *map(str, fds)],
                                                    pass_fds=fds))
            inbox: asyncio.Queue[tuple] = asyncio.Queue()
            _, wire = await loop.create_unix_connection(lambda q=inbox: _Inbox(q), sock=ours)
            wire.send((*config_message, front))
            self._wires.append(wire)
            self._inboxes.append(inbox)
        for front, inbox in enumerate(self._inboxes, start=1):
            message = await inbox.get()
            if message[0] != "listening":
                detail = message[1] if message[0] == "error" else "it exited"
                raise RuntimeError(f"HTTP process {front} of serve.api_servers did not start: {detail}")
            self._watches.append(asyncio.ensure_future(self._watch(front, inbox)))

    async def _watch(self, front: int, inbox: asyncio.Queue[tuple]) -> Served | None:
        message = await inbox.get()
        if message[0] == "served":
            return Served(*message[1:])
        if self.board is not None:
            self.board.rows[front, -1] = 0  # its requests are gone (metrics.ServerMetrics.values: the last)
        if not self._stopping:
            print(f"warning: HTTP process {front} of serve.api_servers exited; its requests were aborted, "
                  f"the others serve on", file=sys.stderr, flush=True)
        return None

    async def stop(self) -> list[Served]:
        """Stop every front (its requests in flight aborted) and return what each served."""
        self._stopping = True
        for wire in self._wires:
            wire.send(("stop",))
        served = []
        for watch in self._watches:
            try:
                part = await asyncio.wait_for(watch, STOP_TIMEOUT_S)
            except TimeoutError:
                part = None
            if part is not None:
                served.append(part)
        for wire in self._wires:
            if wire.transport is not None:
                wire.transport.close()
        for proc in self._procs:
            await asyncio.to_thread(_wait_or_kill, proc)
        return served


class _Inbox(WireProtocol):
    """What the other end of a front-to-front-0 socket sends, queued; lost once it closes."""

    def __init__(self, queue: asyncio.Queue[tuple], lost: tuple = ("gone",)) -> None:
        super().__init__(queue.put_nowait, lambda exc: queue.put_nowait(lost))


def _wait_or_kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def run_front(parent: socket.socket, core_sock: socket.socket, board_fd: int) -> None:
    """A front's life: its config from front 0, the core attached, the routes served until stop."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple] = asyncio.Queue()
    _, wire = await loop.create_unix_connection(lambda: _Inbox(inbox, lost=("stop",)), sock=parent)  # front 0 gone
    _, rc, config, port, front = await inbox.get()
    board = MetricsBoard(board_fd, config.api_servers, row_width())
    try:
        server, _ = await make_server(rc, config, front, board, core_sock)
        sock = listening_socket(config.host, port)
    except (OSError, ValueError, RuntimeError) as error:
        wire.send(("error", f"{type(error).__name__}: {error}"))
        await _flushed(wire)
        return
    gc.freeze()  # as front 0 (server.serve_async): collections never scan the imported stack while serving
    uv = Quiet(uvicorn.Config(create_app(server), log_level=config.log_level, lifespan="off",
                              timeout_graceful_shutdown=5), server.core.close)
    task = asyncio.ensure_future(uv.serve(sockets=[sock]))
    while not uv.started and not task.done():
        await asyncio.sleep(0.01)
    core = server.core
    if task.done():
        wire.send(("error", f"uvicorn stopped: {task.exception()!r}"))
        await core.stop()
        await _flushed(wire)
        return
    wire.send(("listening",))
    cpu = time.thread_time()
    stop = asyncio.ensure_future(inbox.get())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    uv.should_exit = True
    await task
    cpu = time.thread_time() - cpu
    await core.stop()
    wire.send(("served", server.times, list(core.lags), list(core.send_lags), cpu, core.tokens_sent))
    await _flushed(wire)


async def _flushed(wire: WireProtocol) -> None:
    """Until the transport has written what it holds (the process exits right after)."""
    deadline = time.perf_counter() + STOP_TIMEOUT_S
    transport: Any = wire.transport
    while transport is not None and not transport.is_closing() and transport.get_write_buffer_size() \
            and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if len(argv) != 3 or not all(a.isdigit() for a in argv):
        print("error: harness.serve.front is started by `python -m harness.serve serve.api_servers=N` with its "
              "sockets; run that instead", file=sys.stderr)
        raise SystemExit(2)
    parent_fd, core_fd, board_fd = map(int, argv)
    run_event_loop(run_front(socket.socket(fileno=parent_fd), socket.socket(fileno=core_fd), board_fd))


if __name__ == "__main__":
    main(sys.argv[1:])
