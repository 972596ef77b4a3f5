"""What a tensor-parallel worker process runs: load this rank's shard, then serve rank 0's
messages until "shutdown" (see engine.tp.workers for the protocol)."""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import sys

import torch

from engine.tp.group import DistGroup, apply_safe_env
from engine.worker_loop import serve


def worker_main(spec, conn) -> None:
    apply_safe_env()
    # `kill -USR1 <pid>` prints every thread's stack: a rank that does not answer can be read
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(spec.num_threads)
    state = {"tp_rank": spec.rank}

    def start():
        from engine.rank import build_runner  # after the env is set: it imports the CUDA stack

        device = torch.device("cuda", spec.rank) if spec.device_type == "cuda" else torch.device("cpu")
        conn.send(("hello", None))
        state["group"] = group = DistGroup(spec.rank, spec.size, spec.port, device, spec.timeout_s,
                                                spec.engine_config.execution.all_reduce)
        runner = build_runner(spec.engine_config, spec.scheduler_config, spec.cache_config, device, group)
        conn.send(("ready", None))
        return lambda kind, payload: _answer(runner, conn, kind, payload, state)

    def stop() -> None:
        if "shards" in state:
            state["shards"].close()
        if "group" in state and spec.device_type != "cuda":
            state["group"].destroy()

    serve(conn, start, stop)
    if spec.device_type == "cuda":
        # NOTE: a CUDA worker leaves without tearing its NCCL communicator down. On 2 x H200 that
        # teardown, destroy or abort alike, held the worker ~30 s until rank 0 terminated it,
        # although rank 0 had left within 0.5 s (experiments/tp/shutdown_probe.py); nothing is
        # left to agree on, and the driver frees the process's device memory as it exits.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _answer(runner, conn, kind: str, payload, state: dict) -> None:
    shards = state.get("shards")  # a disaggregated replica's KV moves (engine.kv_link.WorkerShards)
    if kind in ("submit", "step", "kv_read") and shards is not None:
        shards.before_step(runner.kv_cache)
    if kind == "submit":  # payload: (HostBatch, placeholder map)
        runner.follow(*payload)
    elif kind == "step":
        runner.execute_batch(payload, None)
    elif kind in ("kv_send", "kv_recv"):  # payload: (block table, peer replica)
        (shards.send if kind == "kv_send" else shards.recv)(runner.kv_cache, *payload)
    elif kind == "kv_read":  # payload: a block table; the blocks as the next step reads them (checks)
        from engine.kv_link import read_blocks

        conn.send(("ok", read_blocks(runner.kv_cache, payload).cpu()))
    elif kind == "kv_link":  # payload: (rank 0's LinkSpec, number of prefill replicas)
        from engine.kv_link import WorkerShards

        link, num_prefill = payload
        state["shards"] = WorkerShards(dataclasses.replace(link, tp_rank=state["tp_rank"]), num_prefill,
                                       runner.kv_cache, runner.shape.num_kv_heads, runner.max_blocks_per_seq)
        conn.send(("ok", None))
    elif kind == "profile":  # payload: (graph_reserve, staging blocks)
        conn.send(("ok", runner.determine_num_blocks(*payload)))
    elif kind == "allocate":
        runner.allocate_kv_cache(payload)
        conn.send(("ok", None))
    elif kind == "capture":  # payload: the prefill graphs' largest token count (0: none)
        if payload:
            runner.capture_prefill_graphs(payload)
        runner.capture_decode_graphs()
        conn.send(("ok", None))
    else:
        raise ValueError(f"unknown message {kind!r}")
