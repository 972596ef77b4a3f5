"""What a tensor-parallel worker process runs: load this rank's shard, then serve rank 0's
messages until "shutdown" (see engine.tp.workers for the protocol)."""

from __future__ import annotations

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
    state = {}

    def start():
        from engine.rank import build_runner  # after the env is set: it imports the CUDA stack

        device = torch.device("cuda", spec.rank) if spec.device_type == "cuda" else torch.device("cpu")
        conn.send(("hello", None))
        state["group"] = group = DistGroup(spec.rank, spec.size, spec.port, device, spec.timeout_s,
                                                spec.engine_config.execution.all_reduce)
        runner = build_runner(spec.engine_config, spec.scheduler_config, spec.cache_config, device, group)
        conn.send(("ready", None))
        return lambda kind, payload: _answer(runner, conn, kind, payload)

    def stop() -> None:
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


def _answer(runner, conn, kind: str, payload) -> None:
    if kind == "submit":  # payload: (HostBatch, placeholder map)
        runner.follow(*payload)
    elif kind == "step":
        runner.execute_batch(payload, None)
    elif kind == "profile":
        conn.send(("ok", runner.determine_num_blocks(graph_reserve=payload)))
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
