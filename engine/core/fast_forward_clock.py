"""The clock of a fast-forwarded run's segment (engine.core.fast_forward_steps): its steps'
prices, from the runner, and when each starts (plain steps) or is planned (overlapped: the step in
flight completes then). The clock adds durations one at a time, as the step-by-step path's does; a
cumulative sum (itertools.accumulate) is that sum, bit for bit.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from typing import TYPE_CHECKING

from engine.core.fast_forward_parts import shifted

if TYPE_CHECKING:
    from engine.core.fast_forward_steps import Booking

_FEW = 16  # steps priced and timed one by one before arrays are


def timed(booking: Booking, first: int, count: int, horizon: float) -> tuple[list[float], list[float]]:
    """Durations of the steps from first on (at most count) that start before horizon, and
    the clock along them: plain, times[m] is step first + m's start; overlapped, when it is
    planned (the step in flight completes then). The clock adds them one at a time."""
    if count <= 0:
        return [], []
    assert booking.plan is not None
    overlap = booking.overlap
    if not booking.arrays:  # a cost model with state: priced one at a time, never a step past the horizon
        prices = booking.runner.decode_prices(shifted(booking.plan, first - 1))
        return clocked(overlap, prices, count, horizon, [], [booking.t], booking.previous)
    # a few steps one by one (numpy's calls would cost more), then arrays of the steps the
    # horizon leaves room for (a step lasts no less than the one before it in a batch: an
    # upper bound; more follow if it is not)
    few = min(count, _FEW)
    if horizon < math.inf and booking.previous_priced > 0.0:
        few = min(few, int((horizon - booking.t) / booking.previous_priced) + 2)
    taking = booking.runner.decode_run_prices(booking.plan, first, few)
    assert taking is not None
    durations, times = clocked(overlap, iter(taking), few, horizon, [], [booking.t], booking.previous)
    size = len(durations)
    while size and len(durations) < count and times[-1] < horizon:
        taken = len(durations)
        size = count - taken
        if horizon < math.inf:
            size = min(size, int((horizon - times[-1]) / durations[-1]) + 2)
        more = booking.runner.decode_run_prices(booking.plan, first + taken, size)
        assert more is not None
        if size <= _FEW:
            clocked(overlap, iter(more), size, horizon, durations, times, durations[-1])
            if len(durations) < taken + size:
                break
            continue
        # times[-1]: when step first + taken starts (plain) or is planned, the one before it in flight
        clock = list(accumulate([times[-1], durations[-1], *more] if overlap else [times[-1], *more]))
        steps = bisect_left(clock, horizon, 0, size)
        durations += more[:steps]
        times += clock[1 : steps + 1]
        if steps < size:
            break
    if durations:
        booking.previous_priced = durations[-1]
    return durations, times


def clocked(overlap: bool, prices: Iterator[float], count: int, horizon: float, durations: list[float],
            times: list[float], previous: float) -> tuple[list[float], list[float]]:
    """Take prices one at a time (each only once its step starts before horizon), the clock
    along them appended to times."""
    t = times[-1]
    for _ in range(count):
        if t >= horizon:
            break
        duration = next(prices)
        durations.append(duration)
        if overlap:
            t += previous
            previous = duration
        else:
            t += duration
        times.append(t)
    return durations, times
