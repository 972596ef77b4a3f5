"""uvicorn's server, ending the requests in flight when it begins to shut down.

uvicorn's shutdown waits up to its graceful timeout for every response to finish, then cancels
the handlers: a stream that has thousands of tokens to go held the stop for the whole timeout,
and then its connection was cut mid-body (the client read an incomplete chunked body) and each
cancelled handler logged a traceback. Ending them first (the server's on_shutdown: each request
aborted, its stream closed with finish_reason "abort" and [DONE]) lets every response finish
before the wait begins.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)
