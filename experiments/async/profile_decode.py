"""Kernel time of the engine's steps on the bench workload, by torch.profiler (CUPTI).

    python experiments/async/profile_decode.py --model qwen3-0.6b --out $OUT

Runs a shortened bench (--requests requests, outputs capped at --max-tokens) once to warm up,
then once under the profiler, and writes the kernels' total device time (kernels.csv, and the
top of the table to kernels.txt). Decode steps replay CUDA graphs; CUPTI still sees each
kernel of a replay.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from engine import LLM
from harness.scripting import probe_args, probe_parser
from harness.workloads import WorkloadConfig, build_workload


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = probe_args(parser, argv)
    out = args.out
    llm = LLM(args.ckpt, max_model_len=args.max_model_len)
    vocab_size = llm.executor.info().vocab_size
    requests = build_workload(WorkloadConfig(num_requests=args.requests), args.max_model_len, vocab_size).requests
    prompts = [r.prompt_token_ids for r in requests]
    params = [dataclasses.replace(r.sampling_params, seed=None,
                                  max_tokens=min(args.max_tokens, r.sampling_params.max_tokens))
              for r in requests]
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
    steps = llm.last_run.steps
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us:
            rows.append({"name": event.key[:120], "count": event.count, "device_ms": device_us / 1e3})
    frame = pd.DataFrame(rows).sort_values("device_ms", ascending=False)
    frame.to_csv(out / "kernels.csv", index=False)
    decode = [s for s in steps if s.stats.kind == "decode"]
    head = (f"{len(steps)} steps ({len(decode)} decode, mean batch "
            f"{sum(s.stats.num_requests for s in decode) / max(1, len(decode)):.0f}); step spans sum "
            f"{sum(s.duration_s for s in steps) * 1e3:.0f} ms, decode {sum(s.duration_s for s in decode) * 1e3:.0f} ms")
    (out / "kernels.txt").write_text(head + "\n" + frame.head(40).to_string(index=False) + "\n")
    print(head)
    print(frame.head(40).to_string(index=False))


if __name__ == "__main__":
    main()
