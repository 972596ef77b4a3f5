"""Where the host time of an eager step goes: cProfile over eager generate() calls on the GPU.

    python experiments/async/host_profile.py --model qwen3-0.6b --out $OUT

Eager steps (prefill always; decode without CUDA graphs) launch every kernel from Python; a
launch-bound step's length is that host time. Writes host_profile.txt (top functions by own
time and by cumulative time) and the mean eager step time with and without the profiler.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

from engine import LLM, SamplingParams
from harness.scripting import probe_args, probe_parser


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0])
    args = probe_args(parser, argv)
    out = args.out
    llm = LLM(args.ckpt, max_model_len=args.max_model_len, enforce_eager=True)
    prompts = [[(7 * i + j) % 5000 + 10 for j in range(64)] for i in range(4)]
    params = SamplingParams(temperature=0.6, max_tokens=16, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    plain = (time.perf_counter() - t) / len(llm.last_run.steps)
    profiler = cProfile.Profile()
    profiler.enable()
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    text.write(f"eager steps: {len(llm.last_run.steps)}, "
               f"mean wall per step {plain * 1e3:.2f} ms without the profiler\n")
    for key in ("tottime", "cumulative"):
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(key).print_stats(35)
    with torch.cuda.device(0):
        torch.cuda.set_sync_debug_mode("warn")
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.set_sync_debug_mode(0)
        syncs = sorted({str(w.message)[:200] for w in caught})
    text.write(f"\nsynchronizing calls seen in one generate(): {len(caught)}\n" + "\n".join(syncs) + "\n")
    (out / "host_profile.txt").write_text(text.getvalue())
    print(text.getvalue()[:6000])


if __name__ == "__main__":
    main()
