"""nano-vllm's throughput bench through LLM.generate, with a per-step profile.

    python experiments/engine/bench_engine.py --preset qwen3-0.6b \
        --variants default,eager,torch --ckpt-root /tmp/ckpt --out experiments/engine/results

Workload (nano-vllm's bench.py): 256 requests at once, seed 0, prompt and output lengths uniform
in [100, 1024] inclusive, token ids uniform below 10,000, temperature 0.6, ignore_eos,
max_model_len 4096; one short generate first as warm-up. The requests come from the harness's
bench workload (harness.workloads, WorkloadConfig defaults) with the per-request seeds dropped, as
nano-vllm's requests carry none. Output tokens/s = generated tokens / wall time of generate().

Variants are deltas over EngineConfig's defaults at the commit that ran them (fused_kernels
became "triton" by default after experiments/fused/h100_run1; earlier results ran it "off").
Variants: default (auto backend: triton on CUDA without flash-attn, CUDA graphs), unfused
(fused_kernels="off": the layers' and sampler's torch ops), eager (CUDA
graphs off), torch (the reference attention backend, hence eager), compiled (default plus
torch.compile on the RMSNorm and SiluAndMul modules: an experiment on elementwise fusion, not an
engine feature), fused (default plus EngineConfig.fused_kernels="triton": the fused Triton norm,
rotary, SiLU and sampling kernels), fused_eager (fused without CUDA graphs), sync
(async_scheduling=False: each step runs to completion before the next is planned; the default
overlaps them on CUDA), tp2 (tensor_parallel_size=2, needs two GPUs; async scheduling, the
default at any TP size since issue 16), tp2_sync (tp2 with async_scheduling=False, as tp2 ran
before issue 16), tp2_nccl (tp2 with every all-reduce on NCCL, ExecutionConfig.all_reduce="nccl";
tp2 runs the default, "auto"), tp2_oneshot (tp2 with decode-sized all-reduces, fused with the norm after them,
through engine.tp.symmetric: all_reduce="symmetric"), fp8_kv (default with an fp8 KV cache,
CacheConfig.kv_cache_dtype="fp8": half the bytes per cached token; its fraction_of_bound is left
empty, the bound being the bf16 cache's), counts (default with EngineConfig.record_expert_counts: an
MoE model counts the tokens routed to each expert; the run's counts go to
expert_counts_counts.csv and the row gets routing_skew, sim.moe.fit_routing_skew of them).
A variant's row records whether it overlapped steps (async_scheduling).

--load-format dummy serves the preset's shape with random weights made on the device (engine.dummy)
instead of writing a checkpoint to --ckpt-root: the MoE presets (qwen3-30b-a3b is about 61 GB)
do not fit the GPU machines' disk.

Each variant appends a row to bench.csv and its steps to steps.csv; bench.md summarises both.
Step phases come from engine.step_timing (host time per phase, device time by CUDA events); the
scheduler's share is the wall time between steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import logging
import platform
import sys
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

from engine import LLM, SamplingParams
from engine.checkpoint import write_checkpoint
from engine.step_timing import StepTimer
from harness.workloads import WorkloadConfig, build_workload

VARIANTS = {
    "default": {},
    "unfused": {"fused_kernels": "off"},
    "eager": {"enforce_eager": True},
    "torch": {"attention_backend": "torch"},
    "compiled": {},
    "fused": {"fused_kernels": "triton"},
    "fused_eager": {"fused_kernels": "triton", "enforce_eager": True},
    "sync": {"async_scheduling": False},
    "even_decode": {"balanced_decode": False},  # kernels.decode_split's even rule
    "triton": {"attention_backend": "triton"},
    "flash_attn": {"attention_backend": "flash_attn"},
    "tp2": {"tensor_parallel_size": 2},
    "tp2_sync": {"tensor_parallel_size": 2, "async_scheduling": False},
    "tp2_nccl": {"tensor_parallel_size": 2, "all_reduce": "nccl"},
    "tp2_oneshot": {"tensor_parallel_size": 2, "all_reduce": "symmetric"},
    "fp8_kv": {"kv_cache_dtype": "fp8"},
    "counts": {"record_expert_counts": True},  # an MoE model's routed tokens per layer and expert
}
# Output tokens/s of this workload on one H100 if weights and KV were read once per decode step
# at the measured 3.0 TB/s and matmuls ran at 798 TFLOP/s (issue 5); for qwen3-0.6b only.
H100_BOUND_TOK_S = {"qwen3-0.6b": 25_500}


def workload(max_model_len: int, num_requests: int, vocab_size: int):
    cfg = WorkloadConfig(num_requests=num_requests)
    requests = build_workload(cfg, max_model_len, vocab_size).requests
    prompts = [r.prompt_token_ids for r in requests]
    params = [dataclasses.replace(r.sampling_params, seed=None) for r in requests]
    return prompts, params


def compile_elementwise(llm: LLM) -> int:
    """torch.compile each RMSNorm and SiluAndMul module in place (fuses their elementwise ops)."""
    from engine.layers.activation import SiluAndMul
    from engine.layers.norm import RMSNorm

    modules = [m for m in llm.executor.runner.model.modules() if isinstance(m, (RMSNorm, SiluAndMul))]
    for m in modules:
        m.compile(dynamic=True)
    return len(modules)


def step_table(llm: LLM, timer: StepTimer | None, preset: str, variant: str) -> pd.DataFrame:
    """The last generate()'s steps, with the gap before the next one and the timer's phases."""
    steps = pd.DataFrame([{**dataclasses.asdict(r.stats), "start_s": r.start_s, "duration_s": r.duration_s,
                           "idle_s": r.idle_s} for r in llm.last_run.steps])
    if llm.executor.info().overlaps_steps:  # the device's own idle time before each step (CUDA events)
        steps["gap_s"] = steps.idle_s.shift(-1).fillna(0.0)
    else:
        steps["gap_s"] = (steps.start_s.shift(-1) - (steps.start_s + steps.duration_s)).fillna(0.0)
    if timer is not None and len(timer.records) == len(steps):
        steps = pd.concat([steps, pd.DataFrame(timer.records)], axis=1)
    steps.insert(0, "variant", variant)
    steps.insert(0, "preset", preset)
    return steps


def run_variant(ckpt: str, variant: str, args, device_name: str) -> tuple[dict, pd.DataFrame]:
    device = {"device": args.device} if args.device else {}
    t0 = time.perf_counter()
    load = {"load_format": "dummy"} if args.load_format == "dummy" else {}
    llm = LLM(ckpt, **VARIANTS[variant], max_model_len=args.max_model_len, **device, **load)
    executor = llm.executor
    if variant == "compiled":
        n = compile_elementwise(llm)
        print(f"compiled {n} modules; re-capturing graphs", flush=True)
        executor.runner.capture_decode_graphs()  # graphs now replay the compiled kernels
    startup_s = time.perf_counter() - t0
    llm.generate(["Benchmark: "], SamplingParams(), use_tqdm=False)  # warm-up, as nano-vllm does
    prompts, params = workload(args.max_model_len, args.num_requests, executor.info().vocab_size)
    timer = StepTimer(executor.device) if not args.no_profile else None
    executor.runner.timer = timer
    if executor.device.type == "cuda":
        torch.cuda.synchronize()
    executor.take_expert_counts()  # what start-up and the warm-up routed
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    counts = executor.take_expert_counts()
    errors = [o.error for o in outs if o.error]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
    executor.runner.timer = None
    steps = step_table(llm, timer, args.preset, variant)
    out_tokens = sum(len(o.token_ids) for o in outs)
    prefill = steps[steps.num_prefill_tokens > 0]
    decode = steps[steps.num_decode_tokens > 0]
    row = {
        "device": device_name, "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "preset": args.preset, "variant": variant, "attention_backend": executor.attention_backend,
        "cuda_graphs": executor.uses_cuda_graphs, "async_scheduling": executor.info().overlaps_steps,
        "num_kv_blocks": executor.info().num_blocks,
        "block_size": executor.info().block_size, "requests": len(prompts),
        "prompt_tokens": sum(map(len, prompts)), "output_tokens": out_tokens, "wall_s": wall,
        "output_tok_s": out_tokens / wall,
        "prefill_tok_s": prefill.num_prefill_tokens.sum() / prefill.duration_s.sum(),
        "decode_tok_s": decode.num_decode_tokens.sum() / decode.duration_s.sum(),
        "steps": len(steps), "prefill_steps": len(prefill), "decode_steps": len(decode),
        "mean_decode_batch": decode.num_decode_tokens.mean(), "executor_s": steps.duration_s.sum(),
        "between_steps_s": wall - steps.duration_s.sum(), "startup_s": startup_s,
        "fraction_of_bound": (out_tokens / wall / H100_BOUND_TOK_S[args.preset]
                              if args.preset in H100_BOUND_TOK_S and "H100" in device_name
                              and "kv_cache_dtype" not in VARIANTS[variant] else float("nan")),
    }
    for col in [c for c in steps.columns if c.startswith(("host_", "gpu_"))]:
        row[f"decode_mean_{col[:-2]}_us"] = 1e6 * decode[col].mean()
        row[f"total_{col}"] = steps[col].sum()
    if counts is not None:
        from sim.moe import fit_routing_skew

        counts.frame().to_csv(Path(args.out) / f"expert_counts_{variant}.csv", index=False)
        row["routing_skew"] = fit_routing_skew(counts.tokens, executor.runner.shape.num_experts_per_tok)
    row["decode_mean_step_us"] = 1e6 * decode.duration_s.mean()
    row["decode_mean_gap_us"] = 1e6 * decode.gap_s.mean()
    profile = executor.runner.memory_profile
    if profile is not None:
        row["kv_budget_gib"] = profile.kv_budget_bytes(llm.engine_config.execution.gpu_memory_utilization) / 1024**3
        row["peak_activation_gib"] = profile.peak_activation_bytes / 1024**3
        row["graph_reserve_gib"] = profile.graph_reserve_bytes / 1024**3
    llm.shutdown()
    del llm, executor
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return row, steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--variants", default="default,eager,torch")
    parser.add_argument("--ckpt-root", default="/tmp/ckpt")
    parser.add_argument("--out", required=True)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--device", default=None, help="EngineConfig.device (default: auto)")
    parser.add_argument("--no-profile", action="store_true", help="no per-step phase timing")
    parser.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                        help="dummy: random weights of the preset made on the device, no checkpoint written")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = Path(args.ckpt_root) / args.preset if args.load_format == "auto" else Path(args.preset)
    if args.load_format == "auto" and not (ckpt / "config.json").is_file():
        t = time.perf_counter()
        write_checkpoint(args.preset, ckpt, seed=0, dtype="bfloat16")
        print(f"wrote {args.preset} checkpoint in {time.perf_counter() - t:.1f} s", flush=True)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    command = "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])])
    for variant in args.variants.split(","):
        try:
            row, steps = run_variant(str(ckpt), variant, args, device_name)
        except Exception:  # noqa: BLE001 - one failed variant must not lose the others' results
            traceback.print_exc()
            continue
        row["command"] = command
        _append(out / "bench.csv", pd.DataFrame([row]))
        _append(out / "steps.csv", steps)
        print(f"{args.preset} {variant}: {row['output_tokens']} output tokens in {row['wall_s']:.2f} s = "
              f"{row['output_tok_s']:,.0f} tok/s (prefill {row['prefill_tok_s']:,.0f} tok/s, decode "
              f"{row['decode_tok_s']:,.0f} tok/s); {row['num_kv_blocks']} KV blocks", flush=True)


def _append(path: Path, frame: pd.DataFrame) -> None:
    if path.is_file():
        frame = pd.concat([pd.read_csv(path), frame], ignore_index=True)
    frame.to_csv(path, index=False)


if __name__ == "__main__":
    main()
