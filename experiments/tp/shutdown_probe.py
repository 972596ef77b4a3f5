"""Where a tensor-parallel engine's shutdown waits: one TP=2 engine (Qwen3-0.6B shape), a short
generate, then shutdown() with every rank's stacks printed after --dump-after seconds (the
workers print theirs on SIGUSR1, engine.tp.worker_main) and the times at which rank 0 began and
finished leaving its process group.

    python3 -m experiments.tp.shutdown_probe --ckpt /tmp/ck06   # on a 2-GPU machine
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default="/tmp/ck06", help="checkpoint folder, written (Qwen3-0.6B shape) if absent")
    parser.add_argument("--dump-after", type=float, default=6.0, help="seconds into shutdown() to print the stacks")
    parser.add_argument("--all-reduce", default="auto", help="ExecutionConfig.all_reduce")
    args = parser.parse_args(argv)

    from engine import LLM, SamplingParams
    from engine.checkpoint import write_checkpoint

    ckpt = write_checkpoint("qwen3-0.6b", args.ckpt, dtype="bfloat16")
    llm = LLM(str(ckpt), tensor_parallel_size=2, all_reduce=args.all_reduce, max_model_len=1024, max_num_seqs=64,
              max_num_batched_tokens=8192, gpu_memory_utilization=0.5)
    print("up:", llm.executor.info().all_reduce, flush=True)
    llm.generate([[1, 2, 3] * 10], SamplingParams(max_tokens=8), use_tqdm=False)
    start = time.perf_counter()
    group, pids = llm.executor.group, [p.pid for p in llm.executor.workers.procs]
    destroy = group.destroy

    def timed_destroy() -> None:
        print(f"rank 0 leaves its group at {time.perf_counter() - start:.2f} s", flush=True)
        destroy()
        print(f"rank 0 left at {time.perf_counter() - start:.2f} s", flush=True)

    group.destroy = timed_destroy

    def dump() -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                print(f"worker {pid} already gone", flush=True)
        print(f"---- rank 0 at {time.perf_counter() - start:.2f} s", flush=True)
        faulthandler.dump_traceback(file=sys.stdout, all_threads=True)

    timer = threading.Timer(args.dump_after, dump)
    timer.start()
    llm.shutdown()
    timer.cancel()
    print(f"shutdown took {time.perf_counter() - start:.2f} s", flush=True)


if __name__ == "__main__":
    main()
