"""What a tensor-parallel worker process runs: load this rank's shard, then serve rank 0's
messages until "shutdown" (see engine.tp.workers for the protocol)."""

from __future__ import annotations

import traceback

import torch

from engine.tp.group import DistGroup, apply_safe_env


def worker_main(spec, conn) -> None:
    apply_safe_env()
    torch.set_num_threads(spec.num_threads)
    group = None
    try:
        from engine.rank import build_runner  # after the env is set: it imports the CUDA stack

        device = torch.device("cuda", spec.rank) if spec.device_type == "cuda" else torch.device("cpu")
        conn.send(("hello", None))
        group = DistGroup(spec.rank, spec.size, spec.port, device, spec.timeout_s)
        runner = build_runner(spec.engine_config, spec.scheduler_config, spec.cache_config, device, group)
        conn.send(("ready", None))
        while True:
            kind, payload = conn.recv()
            if kind == "step":
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
            elif kind == "shutdown":
                break
            else:
                raise ValueError(f"unknown message {kind!r}")
    except (EOFError, KeyboardInterrupt):
        pass  # rank 0 went away: nothing left to serve
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        if group is not None:
            group.destroy()
        conn.close()
