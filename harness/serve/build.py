"""A server's parts from a run's config: its core (started, or attached to another front's) and the
routes' state (harness.serve.app.Server); the event loop they run on."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine
from typing import Any, TypeVar

from harness.config import RunConfig
from harness.labels import run_identity
from harness.serve.app import Server
from harness.serve.board import MetricsBoard
from harness.serve.config import ServeConfig
from harness.serve.core import ServeCore
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


def front_share(max_queue: int, fronts: int, front: int) -> int:
    """serve.max_queue split over the HTTP processes (serve.api_servers): each holds at most its
    share (the first ones take the remainder), so the server holds at most max_queue."""
    return max_queue // fronts + (front < max_queue % fronts)


async def make_server(rc: RunConfig, config: ServeConfig, front: int = 0, board: MetricsBoard | None = None,
                      core_sock: socket.socket | None = None) -> tuple[Server, list[socket.socket]]:
    """Front 0 (core_sock None) starts the core process and gets the other fronts' sockets to it;
    another front attaches through core_sock. board: the shared metrics (serve.api_servers > 1)."""
    sim = rc.backend == "sim"  # the engine's steps are never ahead of their time
    core = ServeCore(rc, config.time_scale if sim else 1.0, front_share(config.max_queue, config.api_servers, front),
                     config.max_early_ms * 1e-3 if sim else 0.0, early_tokens=config.early_tokens)
    if config.api_servers > 1:
        core.queue_full = (f"this HTTP process holds {core.max_queue} requests, its share of serve.max_queue="
                           f"{config.max_queue} over serve.api_servers={config.api_servers}")
    spare: list[socket.socket] = []
    if core_sock is None:
        spare = await core.start(config.api_servers)
    else:
        await core.attach(core_sock)
    try:
        tokenizer = config.tokenizer
        if tokenizer is None and rc.backend == "engine" and rc.engine.load_format != "dummy":
            tokenizer = rc.engine.model  # the checkpoint's; a dummy model carries the project's
        name = config.served_model_name or run_identity(rc)["model"]
        metrics = ServerMetrics(core, name, board, front)
        if board is not None:
            core.after_pass = metrics.publish
        codec = load_codec(rc.backend, tokenizer)
        return Server(core, codec, config, name, tuple(core.info.eos_token_ids[1:]), metrics), spare
    except BaseException:
        for sock in spare:
            sock.close()
        await core.stop()
        raise
