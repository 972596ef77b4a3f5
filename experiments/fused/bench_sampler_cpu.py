"""Sampler cost on the CPU for one decode-sized batch (128 rows x Qwen3's 151,936-token vocabulary).

    PYTHONPATH=. python experiments/fused/bench_sampler_cpu.py [--rows 128] [--repeats 3] [--sampler-file F]

--sampler-file loads class Sampler from another file (e.g. an earlier engine/sampler.py written out
with `git show REV:engine/sampler.py > F`), for a before/after comparison on the same machine.
One torch thread (the development machine's 2 cores are shared). Each scenario is sampled once
as warm-up, then `repeats` times with the output index advanced each time (seeded rows draw new
noise every step, as in a real decode loop); the median wall time is printed as a markdown row.
The logits are float32 N(0, 3^2), so top-p keeps many tokens and no shortcut applies.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch

from engine.core.sampling_params import SamplingParams
from engine.sampler import Sampler

VOCAB = 151_936


def scenarios(rows: int) -> dict[str, list[SamplingParams]]:
    quarter = rows // 4
    mixed = ([SamplingParams(temperature=0.0)] * quarter
             + [SamplingParams(temperature=0.6, seed=i) for i in range(quarter)]
             + [SamplingParams(temperature=0.6, top_p=0.9)] * quarter
             + [SamplingParams(temperature=0.6, top_k=50)] * (rows - 3 * quarter))
    return {
        "greedy": [SamplingParams(temperature=0.0)] * rows,
        "T=0.6 unseeded (engine bench)": [SamplingParams(temperature=0.6)] * rows,
        "T=0.6 seeded (harness bench)": [SamplingParams(temperature=0.6, seed=i) for i in range(rows)],
        "T=0.6 top_k=50, seeded": [SamplingParams(temperature=0.6, top_k=50, seed=i) for i in range(rows)],
        "T=0.6 top_p=0.9": [SamplingParams(temperature=0.6, top_p=0.9)] * rows,
        "T=0.6 top_k=50 top_p=0.9": [SamplingParams(temperature=0.6, top_k=50, top_p=0.9)] * rows,
        "mixed (greedy/seeded/top-p/top-k)": mixed,
    }


def load_sampler(path: str | None) -> type:
    if path is None:
        return Sampler
    spec = importlib.util.spec_from_file_location("sampler_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Sampler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampler-file", default=None)
    args = parser.parse_args(argv)
    sampler_cls = load_sampler(args.sampler_file)
    torch.set_num_threads(1)
    logits = torch.randn(args.rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3.0
    unit, scale = ("ms", 1e3) if args.vocab >= 10_000 else ("us", 1e6)
    print(f"| scenario ({args.rows} x {args.vocab}, 1 thread) | median {unit} |")
    print("|---|---|")
    for name, params in scenarios(args.rows).items():
        sampler = sampler_cls(seed=0)
        times = []
        for step in range(args.repeats + 1):
            indices = [step] * args.rows
            t = time.perf_counter()
            sampler.sample(logits, params, indices)
            times.append(time.perf_counter() - t)
        print(f"| {name} | {scale * statistics.median(times[1:]):.0f} |", flush=True)


if __name__ == "__main__":
    main()
