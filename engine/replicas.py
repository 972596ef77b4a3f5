"""Data parallelism: N engine replicas, one process each (on its own GPU, or its own TP group of
GPUs), each running its own core loop (engine.replica_main), fed by the router in the caller's
process (engine.core.fleet.run_fleet_wall over EngineReplicas' links). An elastic fleet
(engine.core.elastic_wall) starts some of them later, mid-run (launch).

The processes are started, addressed and stopped by engine.tp.workers.Workers (spawn, one pipe
per process). Per replica a sender thread writes the router's messages to its pipe, so routing
never waits on a replica that is busy stepping, and a replica sending a report never waits on a
router that is busy sending it requests.
"""

from __future__ import annotations

import os
import queue
import threading
from multiprocessing.connection import wait

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.disagg_wall import LinkSpec
from engine.core.executor import BackendInfo
from engine.core.loop import WallClock
from engine.replica_main import ReplicaSpec, replica_main
from engine.tp.group import free_port
from engine.tp.workers import Workers
from engine.worker_loop import WorkerError

REPLICA_TIMEOUT_S = 900.0  # loading and capturing a large model's graphs is slow; a step never is
SENDER_JOIN_S = 5.0


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


def replica_specs(configs: list[EngineConfig], scheduler: SchedulerConfig, cache: CacheConfig, num_prefill: int = 0,
                  port: int = 0) -> list[ReplicaSpec]:
    """What each replica process is told (num_prefill > 0: a disaggregated fleet's roles and its
    KV link on `port`, which sizes each replica's staging: ReplicaSpec.kv_staging_blocks)."""
    threads = max(1, (os.cpu_count() or 1) // len(configs))
    tps = tuple(cfg.execution.tensor_parallel_size for cfg in configs)

    def disagg(i: int) -> dict:
        if not num_prefill:
            return {}
        return {"role": "prefill" if i < num_prefill else "decode", "num_prefill": num_prefill,
                "kv_link": LinkSpec(i, len(configs), port, REPLICA_TIMEOUT_S, tps)}

    return [ReplicaSpec(i + 1, cfg, scheduler, cache, devices, REPLICA_TIMEOUT_S, threads, **disagg(i))
            for i, (cfg, devices) in enumerate(zip(configs, visible_devices(configs)))]


class EngineReplicas:
    """The replica processes, loaded and sized (infos), and the router's links to them
    (engine.core.fleet.ReplicaLinks). start_run() hands them the clock; close() stops them."""

    def __init__(self, configs: list[EngineConfig], scheduler: SchedulerConfig, cache: CacheConfig,
                 num_prefill: int = 0, initial: int | None = None) -> None:
        """num_prefill > 0: a disaggregated fleet, configs[:num_prefill] its prefill replicas and the
        rest its decode replicas, joined by a KV link (engine.kv_link). initial: how many replicas
        start and load here (None: all); launch() starts each of the others later, one at a time."""
        count = len(configs) if initial is None else initial
        if not 1 <= count <= len(configs) or (num_prefill and count != len(configs)):
            raise ValueError(f"initial={initial} replicas must be 1..{len(configs)} (all of a disaggregated fleet)")
        self._specs = replica_specs(configs, scheduler, cache, num_prefill, free_port() if num_prefill else 0)
        self._workers = Workers(self._specs[:count], target=replica_main, role="engine replica", daemon=False)
        try:
            self._workers.replies("start")
            # each replica's BackendInfo; None for one launched and not yet ready
            self.infos: list[BackendInfo | None] = self._workers.replies("load")
        except BaseException:
            self._workers.close()
            raise
        self._outboxes: list[queue.SimpleQueue] = []
        self._senders: list[threading.Thread] = []
        for index in range(count):
            self._add_sender(index)

    def _add_sender(self, index: int) -> None:
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        sender = threading.Thread(target=_send_all, args=(self._workers.conns[index], outbox), daemon=True,
                                  name=f"engine-replica-{index + 1}-sender")
        sender.start()
        self._outboxes.append(outbox)
        self._senders.append(sender)

    def launch(self) -> int:
        """Start the next replica's process (engine.core.elastic_wall.ElasticLinks): it says "hello"
        once imported and "ready" (its BackendInfo, kept in infos) once loaded, through receive()."""
        index = len(self._outboxes)
        if index >= len(self._specs):
            raise ValueError(f"all {len(self._specs)} replicas of the fleet are started already")
        self._workers.spawn(self._specs[index])
        self.infos.append(None)
        self._add_sender(index)
        return index

    def __len__(self) -> int:
        return len(self._outboxes)

    def __enter__(self) -> EngineReplicas:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_run(self, clock: WallClock) -> None:
        """Each replica builds its scheduler and loop, on a clock with this one's origin."""
        for index in range(len(self)):
            self.send(index, "run", clock.origin)

    def send(self, index: int, kind: str, payload: object) -> None:
        self._outboxes[index].put((kind, payload))

    def receive(self, timeout: float | None) -> list[tuple[int, str, object]]:
        conns = self._workers.conns
        ready = wait(conns, REPLICA_TIMEOUT_S if timeout is None else timeout)
        if timeout is None and not ready:
            raise WorkerError(f"no engine replica reported anything in {REPLICA_TIMEOUT_S:.0f} s")
        messages = []
        for conn in ready:
            index = conns.index(conn)
            while True:
                kind, payload = self._workers.message(index + 1, "run" if self.infos[index] else "start")
                if kind == "ready":
                    self.infos[index] = payload
                messages.append((index, kind, payload))
                if not conn.poll():
                    break
        return messages

    def close(self) -> None:
        """Stop every replica (a replica mid-run stops between two steps) and its sender."""
        for outbox in self._outboxes:
            outbox.put(("shutdown", None))
            outbox.put(None)
        for sender in self._senders:
            sender.join(SENDER_JOIN_S)
        self._workers.close()


def _send_all(conn, outbox: queue.SimpleQueue) -> None:
    while (message := outbox.get()) is not None:
        try:
            conn.send(message)
        except (OSError, ValueError):
            return  # the replica is gone; receive() says how
