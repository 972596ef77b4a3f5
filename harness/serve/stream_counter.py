"""A lean streaming client: N concurrent /v1/completions streams that only count SSE events.

For timing studies of the server on a small machine: the client's own CPU per token must stay well
below the server's, so the lag measured is the server's, not a starved client's. Each stream is an
asyncio Protocol on its own HTTP/1.1 connection, counting in `data_received` (no coroutine woken per
read), on uvloop's loop where it is installed: every event of the chunked body begins on a new line
with `data: {` (JSON escapes any newline inside a string), so counting b"\\ndata: {" in what arrives
counts the events, whatever the read boundaries.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit

_EVENT = b"\ndata: {"


class _Counter(asyncio.Protocol):
    """Counts one response's events; `done` holds the count once the server closes the connection,
    or the refusal (a status other than 200, with the body's end) as a RuntimeError."""

    def __init__(self, path: str, done: asyncio.Future[int]) -> None:
        self.path, self.done = path, done
        self.count, self.tail = 0, b""
        self.head: bytes | None = b""  # what came before the status line was whole; None after it
        self.refusal: bytes | None = None  # a refused request's response, until the server closes

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            self.refusal += data
            return
        if self.head is not None:
            data, self.head = self.head + data, None
            if b"\r\n" not in data:
                self.head = data
                return
            if not data.startswith(b"HTTP/1.1 200"):
                self.refusal = data
                return
        buffer = self.tail + data
        self.count += buffer.count(_EVENT)
        self.tail = buffer[-(len(_EVENT) - 1):]  # too short to hold a whole (already counted) event

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        if self.refusal is not None:
            status, _, rest = self.refusal.partition(b"\r\n")
            self.done.set_exception(RuntimeError(f"{self.path}: {status.decode().strip()}: {rest.decode()[-500:]}"))
        elif exc is not None:
            self.done.set_exception(exc)
        else:
            self.done.set_result(self.count)


async def count_events(base_url: str, body: dict, path: str = "/completions") -> int:
    """Stream one request (body) to base_url + path; the number of JSON events it answered with."""
    url = urlsplit(base_url)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    transport, _ = await loop.create_connection(lambda: _Counter(path, done), url.hostname, url.port)
    data = json.dumps(body).encode()
    head = (f"POST {url.path}{path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    transport.write(head + data)
    try:
        return await done
    finally:
        transport.close()


async def count_streams(base_url: str, bodies: list[dict]) -> list[int]:
    """All the bodies at once, each on its own connection."""
    return list(await asyncio.gather(*(count_events(base_url, body) for body in bodies)))


def _run(coro: Coroutine[Any, Any, list[int]]) -> list[int]:
    try:
        import uvloop
    except ImportError:  # the serve extra is not installed: asyncio's own loop
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_streams(base_url: str, bodies: list[dict], nice: int = 0) -> list[int]:
    """count_streams on an event loop in a thread of its own, whose nice value is raised by nice
    (Linux sets it per thread; it ends with the thread, so the caller's own priority is untouched)."""
    out: list[list[int]] = []
    errors: list[BaseException] = []

    def main() -> None:
        try:
            if nice:
                tid = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
            out.append(_run(count_streams(base_url, bodies)))
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            errors.append(error)

    thread = threading.Thread(target=main, name="stream-counter")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]
