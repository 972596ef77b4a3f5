"""What the HTTP process hands a request's stream for each step (harness.serve.core).

A Delivery is one step's new tokens for one request. The simulator's steps arrive a step ahead of
their time; each of their deliveries is then offered to its request (Prepare), which may decode its
text and build its stream's event at once (an Ahead), so that when the step is due the loop only
writes: a token's lag behind its schedule is then the write's, not the decoding's and encoding's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.core.request import FinishReason


@dataclass(slots=True)
class Delivery:
    """What one step gave one request: its new tokens, and why it stopped (None: it goes on)."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    due: float  # perf_counter time the tokens were scheduled for
    cached_tokens: int = 0
    ahead: Ahead | None = None  # made when its step arrived (None: declined, or not offered)


@dataclass(slots=True)
class Ahead:
    """A delivery's text, and its stream's event, made when its step arrived ahead of its time
    (Prepare), so that when it is due only the write is left."""

    # None: declined only because an earlier delivery is still to be decoded (the decoder takes
    # tokens in order); decoded when taken, and nothing else is made ahead until then
    text: str | None
    body: bytes | None = None  # the event bytes (None: no stream to write them yet)
    # the stream's writer, called with this at the start of a pass that hands out one step: it
    # writes body (or queues it behind a waiting write) and sets written, or leaves it for later
    write: Callable[[Ahead], None] | None = None
    written: bool = False
    written_at: float | None = None  # perf_counter() when the socket took it (None: not yet)


Sink = Callable[[Delivery], None]  # called on the asyncio loop
# (token ids, reason); None or an Ahead with no text: declined (Generation.prepare says when)
Prepare = Callable[[list[int], FinishReason | None], Ahead | None]
