"""First against second eager prefill of each token count on a fresh MoE engine: does a step of a
count no earlier step had compile a Triton kernel variant (0.3-0.5 s of host time) in the middle
of a run? The r5 held-out call on an H100 had one such step in each of two cells
(experiments/fidelity/h100_30b_r5/README.md, docs/moe-warmup.md).

One engine (random weights, load_format=dummy, expert counts recorded as the protocol does, the
cache sized by profiling), then per token count: an eager prefill of one fresh sequence, timed
twice through submit(); `new_variants` counts the Triton kernels the first one compiled (the
in-memory caches of the fused-MoE kernels). --before restores what the engine did without the fix:
the route/align kernels specialised on their token-count arguments and no fused-MoE warm-up.
Rows go to <out>/first_prefill.csv as each count finishes (mode, tokens, first_s, second_s,
first_step_s, second_step_s, new_variants, startup_s).

    python experiments/moe/first_prefill_probe.py --out $OUT/probe --before   # on a GPU
    python experiments/moe/first_prefill_probe.py --out $OUT/probe            # on a GPU
    python experiments/moe/first_prefill_probe.py --out /tmp/probe --preset tiny-qwen3-moe --device cpu \\
        --tokens 100,300 --max-model-len 512                                     # CPU check
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import pandas as pd

# the counts of the r5 stalls (6030, 6155) and others in every divisibility combination of the old kernels
TOKENS = "1024,2000,3000,4097,5000,6030,6155,7299,8191,9999,12034,14819"
KERNELS = {"kernels.moe_route": ["_route_kernel"],
           "kernels.moe_align_triton": ["_count_kernel", "_scan_kernel", "_scatter_kernel"]}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", default=TOKENS, help="comma-separated token counts")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--before", action="store_true", help="the engine without the fix (see the docstring)")
    args = parser.parse_args(argv)
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens must be comma-separated whole numbers, got {args.tokens!r}")
    if any(t < 1 or t > args.max_model_len for t in args.tokens):
        parser.error(f"--tokens must each be in [1, --max-model-len={args.max_model_len}], got {args.tokens}")
    if args.before and importlib.util.find_spec("triton") is None:
        parser.error("--before needs triton (a GPU machine)")
    return args


def restore_old_engine() -> None:
    """Kernels re-made from their Python functions with Triton's default specialisation, and no
    fused-MoE warm-up: the engine as it was before docs/moe-warmup.md's fix."""
    import importlib

    import triton

    import engine.kv_sizing

    for module, names in KERNELS.items():
        mod = importlib.import_module(module)
        for name in names:
            setattr(mod, name, triton.jit(getattr(mod, name).fn))
    engine.kv_sizing.moe_warmup_counts = lambda *args: ()


def compiled() -> int:
    """Compiled variants held by the fused-MoE kernels (Triton's per-device in-memory caches)."""
    if importlib.util.find_spec("triton") is None:
        return 0
    import importlib as il

    kernels = [getattr(il.import_module(m), n) for m, names in KERNELS.items() for n in names]
    kernels.append(il.import_module("kernels.fused_moe")._grouped_gemm_kernel)
    return sum(len(entry[0]) for k in kernels for entry in getattr(k, "device_caches", {}).values())


def timed_step(executor, plan) -> tuple[float, float]:
    start = time.perf_counter()
    result = executor.submit(plan).result()
    return time.perf_counter() - start, result.duration_s


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    csv = args.out / "first_prefill.csv"
    if args.before:
        restore_old_engine()
    from engine.llm import LLM
    from harness.scripting import probe_plan

    start = time.perf_counter()
    llm = LLM(args.preset, load_format="dummy", device=args.device, record_expert_counts=True,
              max_model_len=args.max_model_len, max_num_batched_tokens=max(16384, max(args.tokens)))
    startup = time.perf_counter() - start
    mode = "before" if args.before else "after"
    print(f"{mode}: engine up in {startup:.1f} s", flush=True)
    try:
        for i, tokens in enumerate(args.tokens):
            plan = probe_plan(llm.executor, llm.scheduler_config, [(tokens, 0, False)], seed=i)
            plan.use_cuda_graphs = False  # eager, as a step larger than the captured graphs runs
            before = compiled()
            first, first_step = timed_step(llm.executor, plan)
            new = compiled() - before
            second, second_step = timed_step(llm.executor, plan)
            row = {"mode": mode, "tokens": tokens, "first_s": first, "second_s": second, "first_step_s": first_step,
                   "second_step_s": second_step, "new_variants": new, "startup_s": startup}
            pd.DataFrame([row]).to_csv(csv, mode="a", header=not csv.exists(), index=False)
            print(f"{mode} {tokens} tokens: first {first:.3f} s, second {second:.3f} s, {new} new variants",
                  flush=True)
    finally:
        llm.executor.shutdown()


if __name__ == "__main__":
    main()
