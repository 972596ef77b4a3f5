"""What one data-parallel engine replica's process runs: an EngineExecutor on its own devices,
serving the main process's steps until "shutdown" (engine.replicas drives it).

This module imports no torch at load time: the spawned process reads its spec first and pins its
GPUs (CUDA_VISIBLE_DEVICES) before the CUDA stack is imported.
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig


@dataclass(frozen=True)
class ReplicaSpec:
    rank: int  # 1-based position among the replicas (engine.tp.workers.Workers' numbering)
    engine_config: EngineConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES of this replica ("2,3"); None: inherit (CPU runs)
    timeout_s: float
    num_threads: int  # torch intra-op threads (CPU runs)


def replica_main(spec: ReplicaSpec, conn) -> None:
    if spec.visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible_devices
    executor = None
    try:
        import torch

        from engine.executor import EngineExecutor

        torch.set_num_threads(spec.num_threads)
        conn.send(("hello", None))
        executor = EngineExecutor(spec.engine_config, spec.scheduler_config, spec.cache_config)
        # the replica serves its steps one at a time (execute): the main process overlaps replicas
        conn.send(("ready", dataclasses.replace(executor.info(), overlaps_steps=False)))
        while True:
            kind, payload = conn.recv()
            if kind == "step":
                conn.send(("done", executor.execute(payload)))
            elif kind == "shutdown":
                break
            else:
                raise ValueError(f"unknown message {kind!r}")
    except (EOFError, KeyboardInterrupt):
        pass  # the main process went away: nothing left to serve
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        if executor is not None:
            executor.shutdown()
        conn.close()
