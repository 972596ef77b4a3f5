"""engine.tp.workers.Workers.close: rank 0 leaves the workers' group while they stop.

A worker's NCCL teardown on "shutdown" can wait for rank 0's. These workers model that: on
"shutdown" each waits for the event rank 0's release sets, and exits 0 only if it came within
LEAVE_WAIT_S: a release that ran only after the joins would come too late.
"""

from __future__ import annotations

import multiprocessing as mp

from engine.tp.workers import JOIN_TIMEOUT_S, Workers
from tests.engine.leave_worker import LEAVE_WAIT_S, Spec, leave_together


def _workers(left) -> Workers:
    return Workers([Spec(rank, 60.0, left) for rank in (1, 2)], target=leave_together)


def test_release_runs_while_the_workers_stop_so_they_leave_together():
    left = mp.get_context("spawn").Event()
    workers = _workers(left)
    workers.close(left.set)
    assert [p.exitcode for p in workers.procs] == [0, 0]


def test_without_a_release_the_workers_wait_it_out():
    assert LEAVE_WAIT_S < JOIN_TIMEOUT_S
    left = mp.get_context("spawn").Event()
    workers = _workers(left)
    workers.close()
    assert [p.exitcode for p in workers.procs] == [3, 3]
    assert not left.is_set()


def test_a_release_after_the_workers_stopped_still_runs():
    left = mp.get_context("spawn").Event()
    workers = _workers(left)
    workers.close()
    workers.close(left.set)
    assert left.is_set()
