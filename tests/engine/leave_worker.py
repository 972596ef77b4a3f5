"""The worker of tests/engine/test_tp_workers_shutdown.py. Standard library only: each spawned
process imports this module, and importing torch there (as engine.tp does) costs seconds a worker."""

from __future__ import annotations

import sys
from dataclasses import dataclass

LEAVE_WAIT_S = 2.0  # under engine.tp.workers.JOIN_TIMEOUT_S: a worker never released exits non-zero first


@dataclass(frozen=True)
class Spec:
    rank: int
    timeout_s: float
    left: object  # an Event of the spawn context: rank 0 has left


def leave_together(spec, conn) -> None:
    """On "shutdown", wait for rank 0's release (spec.left) and exit 0 only if it came in time."""
    while conn.recv()[0] != "shutdown":
        pass
    sys.exit(0 if spec.left.wait(LEAVE_WAIT_S) else 3)
