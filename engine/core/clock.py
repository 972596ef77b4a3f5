"""Clocks of the step loop (engine.core.loop): the simulator's jumps by each step's priced
duration, the engine's is the wall clock. The loop never reads a wall clock itself; a Clock does.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def advance(self, duration_s: float) -> None:
        """A step of this many seconds has just been executed."""

    def wait_until(self, t: float) -> None:
        """Nothing can run before t (the next arrival)."""


class SimulatedClock:
    def __init__(self) -> None:
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def advance(self, duration_s: float) -> None:
        self._t += duration_s

    def wait_until(self, t: float) -> None:
        self._t = max(self._t, t)


class WallClock:
    """Seconds since origin (default: construction), on time.perf_counter()'s clock; advance() is
    a no-op because execute() really took the time.

    NOTE: on Linux perf_counter() is CLOCK_MONOTONIC, one clock for every process of the host, so
    processes that share an origin (data-parallel replicas, engine.replicas) share a time base."""

    def __init__(self, origin: float | None = None) -> None:
        self._t0 = time.perf_counter() if origin is None else origin

    @property
    def origin(self) -> float:
        return self._t0

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, duration_s: float) -> None:
        pass

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)
