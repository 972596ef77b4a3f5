"""Messages between the HTTP process and the core process: pickled objects, each framed by its
length, over one connected Unix socket pair.

The core process reads and writes its end blocking (CoreChannel: it reads only between steps, or
waits when it has nothing to do); the HTTP process's end belongs to its asyncio loop (WireProtocol),
so a write never blocks the loop (the transport buffers it) and a message is handled as soon as the
loop sees it whole. A server with several HTTP processes (serve.api_servers) gives the core process
one socket pair per HTTP process (FanChannel).
"""

from __future__ import annotations

import asyncio
import pickle
import select
import socket
import struct
import threading
from collections.abc import Callable, Sequence
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


class FanChannel:
    """The core process's end with several HTTP processes (fronts, serve.api_servers), one
    CoreChannel each, used as one: what any front sends is read as from one; a step's (or a token
    message's) deliveries go to the front that submitted their requests, and a front with none in a
    step gets the step's gauges alone; the result goes to front 0 (the process that started the core
    and alone says stop), everything else to every front. A front whose socket closes has its
    requests aborted; front 0's closing closes the channel."""

    def __init__(self, socks: Sequence[socket.socket]) -> None:
        self.channels = [CoreChannel(sock) for sock in socks]
        self.owner: dict[str, int] = {}  # live request id -> the front that submitted it

    @property
    def closed(self) -> bool:
        return self.channels[0].closed

    def poll(self) -> list[Any]:
        out: list[Any] = []
        for front, channel in enumerate(self.channels):
            if channel.closed:
                continue
            try:
                out += self._taken(front, channel.poll())
            except OSError:  # reset by a front that died
                if not front:
                    raise
                channel.closed = True
            if channel.closed and front:  # gone (it stopped or died): its requests go too
                gone = [rid for rid, owner in self.owner.items() if owner == front]
                for rid in gone:
                    del self.owner[rid]
                out += [("abort", rid) for rid in gone]
        return out

    def wait(self) -> list[Any]:
        while not (out := self.poll()) and not self.closed:
            select.select([c.sock for c in self.channels if not c.closed], [], [])
        return out

    def _taken(self, front: int, messages: list[Any]) -> list[Any]:
        for message in messages:
            if message[0] == "add":
                self.owner[message[1].request_id] = front
            elif message[0] == "abort":
                self.owner.pop(message[1], None)
        return messages if front == 0 else [m for m in messages if m[0] != "stop"]

    def send(self, message: tuple) -> None:
        kind = message[0]
        if kind == "result":
            self.channels[0].send(message)
            return
        if kind not in ("step", "tokens"):
            for front in range(len(self.channels)):
                self._send(front, message)
            return
        parts: list[list] = [[] for _ in self.channels]
        owner = self.owner
        for delivery in message[2]:
            if (front := owner.get(delivery[0])) is not None:
                parts[front].append(delivery)
                if kind == "step" and delivery[2] is not None:  # finished: the front hears of it now
                    del owner[delivery[0]]
        for front, part in enumerate(parts):
            if part:
                self._send(front, (kind, message[1], part, *message[3:]))
            elif kind == "step":
                self._send(front, ("snap", message[3]))

    def _send(self, front: int, message: tuple) -> None:
        channel = self.channels[front]
        if front == 0:
            channel.send(message)
        elif not channel.closed:
            try:
                channel.send(message)
            except OSError:  # that front is gone; poll() aborts its requests
                pass


Channel = CoreChannel | FanChannel  # the core process's end, whatever the number of fronts


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
