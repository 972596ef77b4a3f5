"""The counters of a server's HTTP processes (serve.api_servers > 1) in one shared block, so that a
scrape of /metrics on any of them counts every request the server took.

The block is a memfd that the first HTTP process creates and passes to the others: a row of float64
per process, written only by its process (after each pass over a step's tokens, and before it
answers a scrape), read by any. Rows are counts that only grow, so a scrape that reads a row while
its process writes it sees a few of that instant's counts or not, never a count that goes back.
"""

from __future__ import annotations

import mmap
import os

import numpy as np


class MetricsBoard:
    """board.publish(front, values) writes a process's row; board.total() sums the rows."""

    def __init__(self, fd: int, fronts: int, width: int) -> None:
        self.fd, self.fronts, self.width = fd, fronts, width
        self._map = mmap.mmap(fd, fronts * width * 8)
        self.rows = np.ndarray((fronts, width), dtype=np.float64, buffer=self._map)

    @classmethod
    def create(cls, fronts: int, width: int) -> MetricsBoard:
        """A zeroed block; its fd is passed to the other processes (subprocess's pass_fds)."""
        fd = os.memfd_create("harness-serve-metrics")
        os.ftruncate(fd, fronts * width * 8)
        return cls(fd, fronts, width)

    def publish(self, front: int, values: list[float]) -> None:
        self.rows[front, :] = values

    def total(self) -> np.ndarray:
        return self.rows.sum(axis=0)

    def close(self) -> None:
        del self.rows
        self._map.close()
        os.close(self.fd)
