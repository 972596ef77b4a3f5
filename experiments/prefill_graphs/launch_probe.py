"""Where the host time of an eager (prefill) step goes, op by op, on the GPU.

    python experiments/prefill_graphs/launch_probe.py --model qwen3-0.6b --out $OUT

For each op the eager forward launches (the project's Triton wrappers, torch's GEMM, the
allocations between them) it times the host cost of one call: 400 back-to-back calls on shapes
so small that the device keeps up, host time divided by calls. Then the whole eager forward of
a one-sequence prefill (host time to return, device time) and a cProfile of it. Writes
launch_probe.txt.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch

from engine import LLM
from engine.attention.metadata import make_metadata
from harness.scripting import probe_args, probe_parser
from kernels.activation import silu_and_mul
from kernels.prefill_attention import paged_prefill_attention
from kernels.rmsnorm import add_rms_norm, rms_norm
from kernels.rotary import qk_norm_rope_
from kernels.store_kvcache import store_kvcache


def host_per_call(fn, calls: int = 400) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls
    torch.cuda.synchronize()
    return host


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    args = probe_args(parser, argv)
    out = args.out
    llm = LLM(args.ckpt, max_model_len=args.max_model_len, enforce_eager=True)
    runner = llm.executor.runner
    t = args.tokens
    ops, meta = op_calls(runner, t)
    model, arch, dev = runner.model, runner.shape, runner.device
    lines = [f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, tokens {t}", "", "host us per call:"]
    with torch.inference_mode():
        for name, fn in ops.items():
            lines.append(f"  {name:32s} {host_per_call(fn) * 1e6:8.1f}")
        ids = torch.randint(0, 1000, (t,), device=dev)
        pos = torch.arange(t, device=dev)
        forward = lambda: model(ids, pos, runner.kv_caches, meta)  # noqa: E731
        host = host_per_call(forward, calls=20)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            forward()
        end.record()
        end.synchronize()
        lines += ["", f"eager forward, {arch.num_layers} layers: host {host * 1e3:.2f} ms per call, "
                      f"device {start.elapsed_time(end) / 20:.2f} ms per call (back to back)"]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(10):
            forward()
        torch.cuda.synchronize()
        profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(30)
    body = "\n".join(lines) + "\n\ncProfile of 10 eager forwards (tottime):\n" + text.getvalue()
    (out / "launch_probe.txt").write_text(body)
    print(body[:8000])


def op_calls(runner, t: int):
    """name -> a call of one op the eager forward launches, on t tokens; and the attention metadata."""
    model, arch = runner.model, runner.shape
    dev, dt = runner.device, runner.dtype
    heads, kvh, d = arch.num_heads, runner.num_kv_heads, arch.head_dim
    x = torch.randn(t, arch.hidden_size, device=dev, dtype=dt)
    w = torch.ones(arch.hidden_size, device=dev, dtype=dt)
    qkv = torch.randn(t, (heads + 2 * kvh) * d, device=dev, dtype=dt)
    q, k, v = qkv.split([heads * d, kvh * d, kvh * d], dim=-1)
    q, k, v = q.view(t, heads, d), k.view(t, kvh, d), v.view(t, kvh, d)
    cos = torch.randn(t, d // 2, device=dev)
    sin = torch.randn(t, d // 2, device=dev)
    hw = torch.ones(d, device=dev, dtype=dt)
    gate_up = torch.randn(t, 2 * arch.intermediate_size, device=dev, dtype=dt)
    k_cache, v_cache = runner.kv_caches[0]
    bs = runner.block_size
    table = list(range(-(-t // bs)))
    meta = make_metadata([t], [t], [table], list(range(t)), dev)
    lin = model.model.layers[0].self_attn.qkv_proj
    ops = {
        "rms_norm": lambda: rms_norm(x, w, 1e-6),
        "add_rms_norm": lambda: add_rms_norm(x, x, w, 1e-6),
        "qk_norm_rope_": lambda: qk_norm_rope_(q, k, cos, sin, hw, hw, 1e-6),
        "store_kvcache": lambda: store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping),
        "paged_prefill_attention": lambda: paged_prefill_attention(
            q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, t, d**-0.5),
        "silu_and_mul": lambda: silu_and_mul(gate_up),
        "qkv_proj (module)": lambda: lin(x),
        "torch.nn.functional.linear": lambda: torch.nn.functional.linear(x, lin.weight),
        "torch.empty_like": lambda: torch.empty_like(x),
        "torch.zeros_like": lambda: torch.zeros_like(x),
        "layer 0 (module)": lambda: model.model.layers[0](x, x, cos[:, :], sin, runner.kv_caches[0], meta),
    }
    return ops, meta


if __name__ == "__main__":
    main()
