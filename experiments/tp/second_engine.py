"""Three tensor-parallel engines, one after another, in one process: what each one sums with.

torch numbers the store keys of its symmetric-memory rendezvous by a count it keeps per process.
Rank 0 lives in the caller's process and each engine starts fresh workers, so a second engine's
rendezvous would wait forever for keys its workers never write. engine.tp.symmetric refuses it
before any rank enters the rendezvous: with all_reduce="auto" the engine falls back to NCCL (the
engine's BackendInfo.all_reduce says which it runs), with "symmetric" it fails with one line.
Each engine's tokens are printed (seeded sampling, the same checkpoint): both paths give them;
and how long its shutdown took (every rank leaves the NCCL group together: engine.tp.workers).

    python3 -m experiments.tp.second_engine --ckpt /tmp/ck06   # on a 2-GPU machine
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default="/tmp/ck06", help="checkpoint folder, written (Qwen3-0.6B shape) if absent")
    args = parser.parse_args(argv)

    from engine import LLM, SamplingParams
    from engine.checkpoint import write_checkpoint

    ckpt = write_checkpoint("qwen3-0.6b", args.ckpt, dtype="bfloat16")
    prompts = [[1, 2, 3] * 10, [5] * 40]
    for i, mode in enumerate(("auto", "auto", "symmetric")):
        start = time.perf_counter()
        try:
            llm = LLM(str(ckpt), tensor_parallel_size=2, all_reduce=mode, max_model_len=1024, max_num_seqs=64,
                      max_num_batched_tokens=8192, gpu_memory_utilization=0.5)
        except RuntimeError as error:
            print("engine", i, mode, "refused:", error, flush=True)
            continue
        print("engine", i, mode, "up", llm.executor.info().all_reduce, round(time.perf_counter() - start, 1),
              flush=True)
        try:
            outputs = llm.generate(prompts, SamplingParams(max_tokens=8), use_tqdm=False)
            print("engine", i, [o.token_ids for o in outputs], flush=True)
        finally:
            start = time.perf_counter()
            llm.shutdown()
            print("engine", i, "shut down in", round(time.perf_counter() - start, 1), "s", flush=True)


if __name__ == "__main__":
    main()
