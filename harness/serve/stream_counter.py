"""A lean streaming client: N concurrent /v1/completions streams that only count SSE events.

For timing studies of the server on a small machine: the client's own CPU per token (a few
microseconds: one read, one bytes.count) stays far below the server's, so the lag measured is the
server's, not a starved client's. It speaks HTTP/1.1 on a plain asyncio connection: every event of
the chunked body begins on a new line with `data: {` (JSON escapes any newline inside a string), so
counting b"\\ndata: {" counts the events, whatever the read boundaries.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from urllib.parse import urlsplit

_EVENT = b"\ndata: {"


async def count_events(base_url: str, body: dict, path: str = "/completions") -> int:
    """Stream one request (body) to base_url + path; the number of JSON events it answered with."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    data = json.dumps(body).encode()
    head = (f"POST {url.path}{path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    writer.write(head + data)
    count, tail = 0, b""
    try:
        status = await reader.readline()
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{path}: {status.decode().strip()}: {(await reader.read(4096)).decode()[-500:]}")
        while chunk := await reader.read(1 << 16):
            buffer = tail + chunk
            count += buffer.count(_EVENT)
            tail = buffer[-(len(_EVENT) - 1):]  # too short to hold a whole (already counted) event
    finally:
        writer.close()
    return count


async def count_streams(base_url: str, bodies: list[dict]) -> list[int]:
    """All the bodies at once, each on its own connection."""
    return list(await asyncio.gather(*(count_events(base_url, body) for body in bodies)))


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
            out.append(asyncio.run(count_streams(base_url, bodies)))
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            errors.append(error)

    thread = threading.Thread(target=main, name="stream-counter")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]
