"""New HTTP requests let into the app one per turn of the event loop.

A burst of requests (200 streams opened at once) reaches the app within one turn of the loop, and
each request's way through the app does not wait on anything (its body is in; routing, parsing,
tokenising and submitting are CPU work), so the whole burst ran as one turn, and the core's steps,
waiting on the socket from the core process, were read only after it: on a slow 2-core box the
first tokens of the burst's early requests went out hundreds of milliseconds after their time
(docs/serving.md, "A burst of new requests"). Let in through an Intake, each request starts its way in a turn of its
own; between two, the loop polls its sockets and runs its timers, so a due step waits for at most
one request's way in.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Intake:
    """`await intake.turn()` returns at once for the first request of a loop turn; later ones wait
    for a turn each, in order."""

    def __init__(self) -> None:
        self._taken = False  # a request was let in during this turn (or one is handed the next)
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def turn(self) -> None:
        if not self._taken:
            self._taken = True
            asyncio.get_running_loop().call_soon(self._next_turn)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter  # cancelled (the server stops): _next_turn skips it

    def _next_turn(self) -> None:
        """On the loop's next turn: let the first waiter in (it runs on the turn after, and this
        runs again then), or open the door for whoever comes next."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                asyncio.get_running_loop().call_soon(self._next_turn)
                return
        self._taken = False
