"""What one data-parallel engine replica's process runs: an EngineExecutor on its own devices and
its own core loop (a scheduler made for that executor, so steps overlap as in a single run),
serving the requests the routing process sends it (engine.core.remote_replica has the messages).

This module imports no torch at load time: the spawned process reads its spec first and pins its
GPUs (CUDA_VISIBLE_DEVICES) before the CUDA stack is imported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.disagg import DecodeReplica, PrefillReplica
from engine.core.disagg_wall import LinkSpec
from engine.core.kv_staging import link_staging_blocks
from engine.core.launch_log import LaunchLog
from engine.core.loop import Replica, WallClock
from engine.core.policies import make_scheduler
from engine.core.remote_replica import serve_replica
from engine.worker_loop import serve


@dataclass(frozen=True)
class ReplicaSpec:
    rank: int  # 1-based position among the replicas (engine.tp.workers.Workers' numbering)
    engine_config: EngineConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES of this replica ("2,3"); None: inherit (CPU runs)
    timeout_s: float
    num_threads: int  # torch intra-op threads (CPU runs)
    # a disaggregated fleet's replica: its role ("prefill" or "decode"), its place on the KV link
    # (engine.kv_link) and how many prefill replicas there are; None for an aggregated fleet's
    role: str | None = None
    kv_link: LinkSpec | None = None
    num_prefill: int = 0

    @property
    def kv_staging_blocks(self) -> int:
        """What this replica's KV link stages, kept out of its KV cache (engine.core.kv_staging)."""
        if self.kv_link is None:
            return 0
        link = self.kv_link
        tps = tuple(link.tp_of(i) for i in range(link.size))
        max_blocks = -(-self.scheduler_config.max_model_len // self.cache_config.block_size)
        return link_staging_blocks(self.role, link.rank, self.num_prefill, tps, max_blocks)


def replica_main(spec: ReplicaSpec, conn) -> None:
    if spec.visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.visible_devices
    state = {}

    def start():
        import torch

        from engine.executor import EngineExecutor

        torch.set_num_threads(spec.num_threads)
        conn.send(("hello", None))
        executor = state["executor"] = EngineExecutor(spec.engine_config, spec.scheduler_config, spec.cache_config,
                                                      spec.kv_staging_blocks)
        link = None
        if spec.kv_link is not None:
            from engine.kv_link import KVLink

            if executor.workers:  # each TP rank moves its own shard's pieces: the workers join the link too
                executor.workers.send("kv_link", (spec.kv_link, spec.num_prefill))
            link = KVLink(spec.kv_link, executor.device, executor.runner.shape.num_kv_heads)
            link.warm_up(spec.num_prefill)
            link.stage(executor.runner.kv_cache, spec.num_prefill, executor.runner.max_blocks_per_seq)
            if executor.workers:
                executor.workers.replies("kv_link")
        conn.send(("ready", executor.info()))

        def handle(kind: str, payload) -> bool:
            if kind != "run":
                raise ValueError(f"unknown message {kind!r}")
            # payload: the routing process's clock origin, so both read one time base
            scheduler = make_scheduler(spec.scheduler_config, executor.info(), spec.cache_config)
            clock = WallClock(origin=payload)
            # each step's launch, for the host's speed (engine.core.launch_log); one log per run,
            # as the run's scheduler numbers its steps from 0
            launches = LaunchLog(executor.info().graph_sizes)
            unobserve = executor.observe(launches)
            try:
                return _serve(spec, scheduler, executor, clock, conn, link, launches)
            finally:
                unobserve()

        return handle

    def stop() -> None:
        if "executor" in state:
            state["executor"].shutdown()

    serve(conn, start, stop)


def _serve(spec: ReplicaSpec, scheduler, executor, clock, conn, link, launches: LaunchLog) -> bool:
    """Serve one run (engine.core.remote_replica, or a disaggregated pool's loop with a KV link)."""
    if link is not None:
        from engine.disagg_replica import serve_decode, serve_prefill

        if spec.role == "prefill":
            return serve_prefill(PrefillReplica(spec.rank - 1, scheduler, executor, clock), conn, link, launches)
        index = spec.rank - 1 - spec.num_prefill
        return serve_decode(DecodeReplica(index, scheduler, executor, clock), conn, link, launches)
    return serve_replica(Replica(spec.rank - 1, scheduler, executor, clock), conn, launches)

