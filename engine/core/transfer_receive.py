"""The receive's side of a simulated KV transfer (engine.core.disagg_events uses it), each part
off unless asked for:

recv_behind_step: torch's NCCL receive, posted as the decode replica reserves, waits on the decode
GPU for the step in flight there (it is queued behind the current stream), and a point-to-point
move needs both ends, so the wire starts at the later of the send's start and the end of that
decode step (WireGates holds the three things it waits for).
landing_lag_s (with the handshake): the decode loop checks for landed receives that long after each
step's end (its host work after a step), so a wire that ends within that much after a step end is
seen then, and a landing seen at a later step boundary that much after it (LandingWatch).
send_lag_s (with the handshake): the prefill replica is told to send that long after the decode
replica reserved at its step boundary (its loop's host work, the router's pipes both ways).
"""

from __future__ import annotations

from collections import deque

from engine.core.step_log import StepRecord, StepRun

SEND_START, RECV_START, WIRE_SECONDS = 0, 1, 2
RECENT_ENDS = 4  # a replica runs at most one step past the fleet's event, two with an overlapped one


class WireGates:
    """Per request: the send's start, the receive's start and the wire seconds, as each becomes known."""

    def __init__(self) -> None:
        self.gates: dict[str, list[float | None]] = {}

    def set(self, rid: str, which: int, value: float | None) -> tuple[float, float] | None:
        """Record one (None: not known yet); with all three, (the wire's start, its seconds)."""
        gate = self.gates.setdefault(rid, [None, None, None])
        gate[which] = value
        send, recv, seconds = gate
        if send is None or recv is None or seconds is None:
            return None
        del self.gates[rid]
        return max(send, recv), seconds


class LandingWatch:
    """A decode replica's loop checks for landed receives lag_s after each of its steps' ends."""

    def __init__(self, lag_s: float) -> None:
        self.lag_s = lag_s
        self.ends: dict[int, deque[float]] = {}

    def stepped(self, decode: int, record: StepRecord | StepRun) -> None:
        ends = self.ends.setdefault(decode, deque(maxlen=RECENT_ENDS))
        if isinstance(record, StepRun):
            ends.extend(s + d for s, d in zip(record.starts[-RECENT_ENDS:], record.durations[-RECENT_ENDS:]))
        else:
            ends.append(record.start_s + record.duration_s)

    def seen(self, decode: int, t: float) -> float | None:
        """When a wire that ended at t is seen, if a step of the replica ended at most lag_s before
        t (its loop checks then); else None (the next step boundary's check, lag_s after it)."""
        ends = [e for e in self.ends.get(decode, ()) if t - self.lag_s <= e <= t]
        return max(ends) + self.lag_s if ends else None
