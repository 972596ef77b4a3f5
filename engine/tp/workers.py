"""Ranks 1..size-1 of a tensor-parallel engine, each in a spawned process, driven by rank 0.

Rank 0 talks to each worker over its own multiprocessing Pipe (pickled messages, no shared
memory): control messages ("profile", "allocate", "capture") are answered, step messages are
not, so a step costs rank 0 one pickling and one send per worker and never a wait on a worker:
"step" (a HostBatch of plain numpy arrays, cheap to pickle, run to completion) and "submit"
(a HostBatch and its placeholder map, queued: engine.runner.ModelRunner.follow). Overlapped,
rank 0 sends step N+1 while step N still runs, so a worker queues it behind step N as rank 0
does. A worker that fails reports its traceback on the pipe and exits; rank 0 raises a
WorkerError (engine.worker_loop) of one line, the traceback in its details.

Shutdown sends "shutdown", joins each worker with a timeout, then terminates and kills what is
left. Rank 0 leaves its group meanwhile (close's release, on a thread of its own, so that a
worker that never exits cannot hold rank 0 past the timeout); a CUDA worker exits without
tearing its communicator down (engine.tp.worker_main: on 2 x H200 that teardown held each
shutdown for the whole 30 s join timeout). A weakref finalizer runs the
same at interpreter exit if shutdown() was never called, and the workers are daemonic, so none
outlives the engine's process.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.worker_loop import WorkerError, error_line

JOIN_TIMEOUT_S = 30.0
RELEASE_AFTER_EXIT_S = 10.0


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    size: int
    port: int
    engine_config: EngineConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    device_type: str  # "cuda" (rank r on cuda:r) or "cpu"
    timeout_s: float
    num_threads: int  # torch intra-op threads (CPU runs)


class Workers:
    """target(spec, conn) runs in each process (default: a tensor-parallel rank); role names its
    processes in errors. Data-parallel replicas (engine.replicas) start theirs non-daemonic, since
    a replica with TP > 1 starts its own ranks."""

    def __init__(self, specs: list, target=None, role: str = "tensor-parallel rank", daemon: bool = True) -> None:
        if target is None:
            from engine.tp.worker_main import worker_main as target

        self._ctx = mp.get_context("spawn")
        self._target = target
        self._daemon = daemon
        self.role = role
        self.timeout_s = 0.0
        self.procs: list[mp.Process] = []
        self.conns = []
        for spec in specs:
            self.spawn(spec)
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns)  # the lists spawn() extends

    def spawn(self, spec) -> None:
        """Start one more process; spec.rank must be its 1-based position (len(self.procs) + 1)."""
        if spec.rank != len(self.procs) + 1:
            raise ValueError(f"{self.role} {spec.rank} spawned as process {len(self.procs) + 1}")
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=self._target, args=(spec, child),
                                 name=f"{self.role.replace(' ', '-')}-{spec.rank}", daemon=self._daemon)
        proc.start()
        child.close()  # the worker holds the other end; EOF here then means it died
        self.procs.append(proc)
        self.conns.append(parent)
        self.timeout_s = max(self.timeout_s, spec.timeout_s)

    def send(self, kind: str, payload: Any = None) -> None:
        for conn in self.conns:
            conn.send((kind, payload))

    def replies(self, what: str) -> list[Any]:
        """One answer per worker to the last control message (raises WorkerError on a failure)."""
        return [self._receive(rank, conn, what) for rank, conn in enumerate(self.conns, start=1)]

    def send_batch(self, batch: Any) -> None:
        """A step to run to completion (engine.runner.ModelRunner.execute's on_batch)."""
        self._send_step("step", batch)

    def submit_batch(self, batch: Any, placeholders: Any) -> None:
        """A step to queue (engine.runner.ModelRunner.submit's on_batch)."""
        self._send_step("submit", (batch, placeholders))

    def _send_step(self, kind: str, payload: Any) -> None:
        data = ForkingPickler.dumps((kind, payload))  # once for all workers (what conn.send pickles)
        for rank, (proc, conn) in enumerate(zip(self.procs, self.conns), start=1):
            # A worker only speaks unasked when it failed; a dead one would leave rank 0 waiting
            # in the step's first collective until the timeout, so fail here instead.
            if conn.poll() or not proc.is_alive():
                self._receive(rank, conn, kind)
            conn.send_bytes(data)

    def receive(self, rank: int, what: str) -> Any:
        """The payload of the next message of the process of this rank (1-based: the order of the specs)."""
        return self.message(rank, what)[1]

    def message(self, rank: int, what: str) -> tuple[str, Any]:
        """The next (kind, payload) of the process of this rank; WorkerError if it failed or exited."""
        return self._receive(rank, self.conns[rank - 1], what, payload_only=False)

    def _receive(self, rank: int, conn, what: str, payload_only: bool = True) -> Any:
        deadline = time.monotonic() + self.timeout_s
        proc = self.procs[rank - 1]
        while not conn.poll(0.1):
            if not proc.is_alive() and not conn.poll():
                raise WorkerError(f"{self.role} {rank} exited (code {proc.exitcode}) during {what!r}")
            if time.monotonic() > deadline:
                raise WorkerError(f"{self.role} {rank} gave no answer to {what!r} in {self.timeout_s:.0f} s")
        try:
            kind, payload = conn.recv()
        except EOFError:
            proc.join(1.0)
            raise WorkerError(f"{self.role} {rank} exited (code {proc.exitcode}) during {what!r}") from None
        if kind == "error":
            raise WorkerError(f"{self.role} {rank} failed during {what!r}: {error_line(payload)}", payload)
        return payload if payload_only else (kind, payload)

    def close(self, release: Callable[[], None] | None = None) -> None:
        """Stop the workers; release (rank 0 leaving the group they leave) runs while they stop."""
        if release is None:
            self._finalizer()
        elif self._finalizer.detach() is not None:
            _stop(self.procs, self.conns, release)
        else:  # the workers were stopped already: rank 0 still leaves
            release()


def _stop(procs: list[mp.Process], conns: list, release: Callable[[], None] | None = None) -> None:
    for conn in conns:
        try:
            conn.send(("shutdown", None))
        except (OSError, ValueError):
            pass  # already gone
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    releasing = threading.Thread(target=release, name="tensor-parallel-release", daemon=True) if release else None
    if releasing is not None:
        releasing.start()
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if releasing is not None:
        releasing.join(RELEASE_AFTER_EXIT_S)  # with its peers gone, leaving takes no agreement
    for conn in conns:
        conn.close()
