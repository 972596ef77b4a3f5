"""The memory-bandwidth bound on output tok/s of nano-vllm's bench for a mixture-of-experts model.

    python experiments/moe/decode_bound.py --preset qwen3-30b-a3b \
        --steps experiments/moe/h100/steps.csv --bench experiments/moe/h100/bench.csv --measure   # on a GPU

Per decode step of B sequences the engine must read, at least: every layer's attention weights,
the dense MLPs of the non-sparse layers, each sparse layer's router and the experts the B tokens
chose, the final norm and LM head, and the step's KV cache. Under uniform routing the expected
number of distinct experts B tokens touch with top-k of E is E * (1 - (1 - k/E)^B). The KV read
over the whole run does not depend on the schedule: a request of prompt p and output o reads
p + j cached tokens at its j-th decode token, o * p + o * (o - 1) / 2 in all. Bound time = bytes /
copy bandwidth (a device-to-device copy of 2 GiB, measured with --measure or given with
--copy-tb-s); bound tok/s = output tokens / (bound time of the decode steps). Prefill is left out,
so the bound is generous: a run at 70% of it spends little beyond the unavoidable reads.

Writes bound.json beside --steps (and prints it), with fraction_of_bound when --bench is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from engine.core.model_shapes import ModelShape, model_shape


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Expected number of distinct experts `tokens` tokens touch, each choosing top_k of num_experts
    uniformly at random (each expert is missed by one token with probability 1 - k / E)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def weight_bytes(shape: ModelShape, batch: int) -> float:
    """Bytes of weights one decode step of `batch` sequences reads."""
    h, d, b = shape.hidden_size, shape.head_dim, shape.dtype_bytes
    attention = h * (shape.num_heads * d + 2 * shape.num_kv_heads * d) + shape.num_heads * d * h
    dense_mlp = 3 * h * shape.intermediate_size
    expert = 3 * h * shape.moe_intermediate_size
    total = 0.0
    for layer in range(shape.num_layers):
        total += attention
        if shape.is_moe_layer(layer):
            total += shape.num_experts * h  # the router
            total += expected_distinct_experts(shape.num_experts, shape.num_experts_per_tok, batch) * expert
        else:
            total += dense_mlp
    total += shape.vocab_size * h + batch * h  # LM head, and the batch's embedding rows
    return total * b


def kv_bytes_per_token(shape: ModelShape) -> int:
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes


def bench_kv_tokens(num_requests: int, max_model_len: int) -> tuple[int, int]:
    """(total KV tokens read by all decode tokens, total output tokens) of the bench workload."""
    from harness.workloads import WorkloadConfig, build_workload

    requests = build_workload(WorkloadConfig(num_requests=num_requests), max_model_len, 10_000).requests
    kv = out = 0
    for r in requests:
        p, o = len(r.prompt_token_ids), r.sampling_params.max_tokens
        kv += o * p + o * (o - 1) // 2
        out += o
    return kv, out


def measure_copy_bandwidth() -> float:
    import torch

    x = torch.empty(1024**3, dtype=torch.bfloat16, device="cuda")  # 2 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * x.element_size() * 20 / (start.elapsed_time(end) * 1e-3)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-30b-a3b")
    parser.add_argument("--steps", type=Path, required=True, help="steps.csv of bench_engine.py")
    parser.add_argument("--bench", type=Path, default=None, help="bench.csv of the same run (fraction_of_bound)")
    parser.add_argument("--copy-tb-s", type=float, default=None, help="copy bandwidth, TB/s")
    parser.add_argument("--measure", action="store_true", help="measure the copy bandwidth on this GPU")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args(argv)
    if (args.copy_tb_s is None) == (not args.measure):
        parser.error("give exactly one of --copy-tb-s and --measure")
    bandwidth = measure_copy_bandwidth() if args.measure else args.copy_tb_s * 1e12
    shape = model_shape(args.preset)
    steps = pd.read_csv(args.steps)
    decode = steps[steps.num_decode_tokens > 0]
    weights_s = sum(weight_bytes(shape, int(b)) for b in decode.num_decode_tokens) / bandwidth
    kv_tokens, out_tokens = bench_kv_tokens(args.num_requests, args.max_model_len)
    kv_s = kv_tokens * kv_bytes_per_token(shape) / bandwidth
    result = {"preset": args.preset, "copy_tb_s": bandwidth / 1e12, "decode_steps": len(decode),
              "mean_decode_batch": float(decode.num_decode_tokens.mean()), "weights_s": weights_s, "kv_s": kv_s,
              "output_tokens": out_tokens, "bound_output_tok_s": out_tokens / (weights_s + kv_s)}
    if args.bench is not None:
        measured = float(pd.read_csv(args.bench).output_tok_s.iloc[-1])
        result.update(measured_output_tok_s=measured, fraction_of_bound=measured / result["bound_output_tok_s"])
    (args.steps.parent / "bound.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
