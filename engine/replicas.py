"""Data parallelism: N engine replicas, one process each (on its own GPU, or its own TP group of
GPUs), driven by the scheduler cores in the caller's process (engine.core.fleet.run_fleet_wall).

The processes are started, addressed and stopped by engine.tp.workers.Workers (spawn, one pipe
per process); engine.replica_main is what each one runs. A step is one pickled StepPlan out and
one StepResult back, so every replica computes while the main process plans the others.
"""

from __future__ import annotations

import os
from multiprocessing.connection import wait

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
import time

from engine.core.executor import BackendInfo, StepHook, StepTiming
from engine.core.plan import StepPlan, StepResult
from engine.replica_main import ReplicaSpec, replica_main
from engine.tp.workers import Workers

REPLICA_TIMEOUT_S = 900.0  # loading and capturing a large model's graphs is slow; a step never is


def visible_devices(configs: list[EngineConfig]) -> list[str | None]:
    """Each replica's GPUs: consecutive slices (of the caller's CUDA_VISIBLE_DEVICES if set), one
    per TP rank; None for CPU replicas."""
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    pool = [d for d in parent.split(",") if d.strip()] if parent else None
    out, first = [], 0
    for cfg in configs:
        tp = cfg.execution.tensor_parallel_size
        if cfg.device == "cpu":
            out.append(None)
            continue
        ids = list(range(first, first + tp))
        if pool is not None and ids[-1] >= len(pool):
            raise ValueError(f"fleet needs {first + tp} GPUs for its replicas but CUDA_VISIBLE_DEVICES "
                             f"lists {len(pool)}")
        out.append(",".join(pool[i] if pool is not None else str(i) for i in ids))
        first += tp
    return out


class _Group:
    """The replica processes, shut down when the last client is."""

    def __init__(self, workers: Workers, size: int) -> None:
        self.workers = workers
        self.open_clients = size

    def release(self) -> None:
        self.open_clients -= 1
        if self.open_clients == 0:
            self.workers.close()


class RemoteStep:
    def __init__(self, group: _Group, rank: int, plan: StepPlan, hooks: list[StepHook], called_s: float) -> None:
        self.group = group
        self.rank = rank
        self.conn = group.workers.conns[rank - 1]
        self._plan, self._hooks = plan, hooks
        self._timing = StepTiming(called_s, time.perf_counter(), overlapped=True)

    def result(self) -> StepResult:
        result = self.group.workers.receive(self.rank, "step")
        for hook in self._hooks:
            hook(self._plan, result, self._timing)
        return result


class ReplicaClient:
    """The Executor of one replica process, as the main process's core sees it."""

    def __init__(self, group: _Group, rank: int, info: BackendInfo) -> None:
        self._group = group
        self.rank = rank
        self._info = info  # overlaps_steps False: each replica runs its steps one at a time
        self._hooks: list[StepHook] = []
        self._open = True

    def info(self) -> BackendInfo:
        return self._info

    def observe(self, hook: StepHook) -> None:
        self._hooks.append(hook)

    def hold_device(self, seconds: float) -> bool:
        return False  # the device is in another process

    def submit(self, plan: StepPlan) -> RemoteStep:
        if not self._open:
            raise RuntimeError(f"replica {self.rank - 1}: submit() after shutdown()")
        called = time.perf_counter()
        self._group.workers.conns[self.rank - 1].send(("step", plan))
        return RemoteStep(self._group, self.rank, plan, self._hooks, called)

    def execute(self, plan: StepPlan) -> StepResult:
        return self.submit(plan).result()

    def shutdown(self) -> None:
        if self._open:
            self._open = False
            self._group.release()


def start_engine_replicas(configs: list[EngineConfig], scheduler: SchedulerConfig,
                          cache: CacheConfig) -> list[ReplicaClient]:
    """One process per replica, each loaded and sized; returns their clients in order."""
    threads = max(1, (os.cpu_count() or 1) // len(configs))
    specs = [ReplicaSpec(i + 1, cfg, scheduler, cache, devices, REPLICA_TIMEOUT_S, threads)
             for i, (cfg, devices) in enumerate(zip(configs, visible_devices(configs)))]
    workers = Workers(specs, target=replica_main, role="engine replica", daemon=False)
    try:
        workers.replies("start")
        infos = workers.replies("load")
    except BaseException:
        workers.close()
        raise
    group = _Group(workers, len(specs))
    return [ReplicaClient(group, spec.rank, info) for spec, info in zip(specs, infos)]


def wait_any(pending: list[RemoteStep], timeout: float | None) -> list[int]:
    """Indices of the pending steps whose replies have arrived (or whose process died), waiting
    up to timeout seconds (None: until one does)."""
    ready = set(wait([p.conn for p in pending], timeout))
    return [i for i, p in enumerate(pending) if p.conn in ready]
