"""Messages between the HTTP process and the core process: pickled objects, each framed by its
length, over one connected Unix socket pair.

The core process reads and writes its end blocking (CoreChannel: it reads only between steps, or
waits when it has nothing to do); the HTTP process's end belongs to its asyncio loop (WireProtocol),
so a write never blocks the loop (the transport buffers it) and a message is handled as soon as the
loop sees it whole.
"""

from __future__ import annotations

import asyncio
import pickle
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

_HEADER = struct.Struct("<I")
_READ = 1 << 18


def frame(message: object) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class _Frames:
    """Whole messages out of a byte stream read in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer
        buffer += data
        out: list[Any] = []
        at = 0
        while len(buffer) - at >= _HEADER.size:
            (size,) = _HEADER.unpack_from(buffer, at)
            end = at + _HEADER.size + size
            if len(buffer) < end:
                break
            out.append(pickle.loads(buffer[at + _HEADER.size:end]))
            at = end
        if at:
            del buffer[:at]
        return out


class CoreChannel:
    """The core process's end: send() blocks until written; poll() returns what has arrived (maybe
    nothing) without waiting; wait() blocks until at least one message is in. An empty list from
    wait() means the other end is gone."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._frames = _Frames()
        self.closed = False
        self._sending = threading.Lock()  # the loop and its token sender (harness.serve.handoff) both send

    def send(self, message: object) -> None:
        data = frame(message)
        with self._sending:
            self.sock.sendall(data)

    def poll(self) -> list[Any]:
        out: list[Any] = []
        while not self.closed and select.select([self.sock], [], [], 0)[0]:
            out += self._read()
        return out

    def wait(self) -> list[Any]:
        out: list[Any] = []
        while not out and not self.closed:
            out = self._read()  # blocks in recv: no timer, it wakes when bytes arrive
        return out + self.poll()

    def _read(self) -> list[Any]:
        data = self.sock.recv(_READ)
        if not data:
            self.closed = True
            return []
        return self._frames.feed(data)


class WireProtocol(asyncio.Protocol):
    """The HTTP process's end: each whole message goes to on_message, on the loop; on_lost(error)
    once the core process's end closes (error None: it closed cleanly)."""

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[Exception | None], None]) -> None:
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: Any = None  # asyncio's or uvloop's transport (not an asyncio.Transport subclass)
        self._frames = _Frames()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for message in self._frames.feed(data):
            self.on_message(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(exc)

    def send(self, message: object) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(message))
