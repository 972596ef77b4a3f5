"""Would a decode step run faster as two half-batches on two streams? (issue 16)

A bf16 decode step of Qwen3-0.6B at the bench's batch spends about 82% of its time in attention,
which reads the KV cache at close to the copy ceiling, and the rest in small projections and
elementwise kernels that are bound by latency, not bandwidth. Two halves of the batch are
independent until the LM head, so half A's projections can run while half B's attention streams
the cache. The price is that each layer's weights are read twice.

Variants, each one CUDA graph over the same model, cache and batch:
- `one`: the whole batch, as the engine runs it today;
- `free`: two halves on two streams with no order between them (the GPU interleaves as it can);
- `pingpong`: the halves alternate: while one runs attention, the other runs the projections and
  norms around it (a barrier between phases, as in two-batch overlap).
Batches follow nano-vllm's bench (256 requests, prompts and outputs of 100-1,024 tokens): at
decode step s the requests whose output is longer than s, each with prompt + s tokens of context.
Also reported: the copy and the read-only ceilings, and the decode kernel alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from experiments.kernels.timing import bench, copy_ceiling, read_ceiling

BLOCK_SIZE = 256
MAX_MODEL_LEN = 4096
STEPS = (0, 128, 256, 384, 512, 640, 768, 896, 1000)


def build_model(preset: str):
    from transformers import Qwen3Config

    from engine.attention.triton_backend import TritonAttentionBackend
    from engine.models.presets import preset_config
    from engine.models.qwen3 import Qwen3ForCausalLM

    backend = TritonAttentionBackend()
    model = Qwen3ForCausalLM(Qwen3Config(**preset_config(preset)), backend, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.set_fused_kernels("triton")
    return model.eval(), backend


def bench_batches(seed: int = 0) -> list[tuple[int, np.ndarray]]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(100, 1025, 256)
    outputs = rng.integers(100, 1025, 256)
    return [(s, prompts[outputs > s] + s + 1) for s in STEPS]


class Half:
    """One (half-)batch's static inputs: ids, positions, metadata with the engine's balanced chunk."""

    def __init__(self, contexts: np.ndarray, tables: list[np.ndarray], num_kv_heads: int, device) -> None:
        from engine.attention.metadata import AttentionMetadata
        from kernels.decode_attention import DecodeArrivals
        from kernels.decode_split import balanced_chunk

        n = len(contexts)
        width = -(-MAX_MODEL_LEN // BLOCK_SIZE)
        table = np.zeros((n, width), dtype=np.int32)
        for i, blocks in enumerate(tables):
            table[i, : len(blocks)] = blocks
        last = contexts - 1
        slots = table[np.arange(n), last // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE + last % BLOCK_SIZE
        put = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        self.ids = put(np.zeros(n, dtype=np.int64))
        self.positions = put(last.astype(np.int64))
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        chunk = balanced_chunk(contexts, num_kv_heads, sms)
        self.meta = AttentionMetadata(
            slot_mapping=put(slots), query_start_loc=put(np.arange(n + 1, dtype=np.int32)),
            seq_lens=put(contexts.astype(np.int32)), block_tables=put(table), max_query_len=1,
            max_seq_len=MAX_MODEL_LEN, is_decode_only=True, decode_chunk=put(np.array([chunk], dtype=np.int32)),
        )  # fmt: skip
        self.arrivals = DecodeArrivals()


def segments(model, backend, half: Half, kv_caches, attention: bool = True):
    """The half's forward, yielding after every piece: projections and norms, then attention, then
    the next layer's projections and norms...; returns the final hidden states. attention=False
    passes q on in place of attention's output (the step's work less attention)."""
    cos, sin = model.rotary_emb(half.positions)
    x, residual = model.model.embed_tokens(half.ids), None
    for layer, kv_cache in zip(model.model.layers, kv_caches, strict=True):
        x, residual = (layer.input_layernorm(x), x) if residual is None else layer.input_layernorm(x, residual)
        attn = layer.self_attn
        t, d = x.shape[0], attn.head_dim
        q, k, v = attn.qkv_proj(x).split([attn.num_heads * d, attn.num_kv_heads * d, attn.num_kv_heads * d], -1)
        q, k, v = q.view(t, attn.num_heads, d), k.view(t, attn.num_kv_heads, d), v.view(t, attn.num_kv_heads, d)
        attn.fused_kernels.qk_norm_rope_(q, k, cos, sin, attn.q_norm.weight, attn.k_norm.weight, attn.eps,
                                         store=(v, *kv_cache, half.meta.slot_mapping))
        yield
        backend._arrivals = half.arrivals  # the halves' split counters must not collide
        o = attn.attn(q, None, None, kv_cache, half.meta) if attention else q.reshape(t, -1)
        yield
        x, residual = layer.post_attention_layernorm(attn.o_proj(o), residual)
        x = layer.mlp(x)
    return model.model.norm(x, residual)[0]


def run_halves(model, backend, halves: list[Half], kv_caches, barrier: bool, prioritise: bool = False
               ) -> torch.Tensor:
    """Enqueue both halves on streams of their own; with barrier, phase p runs piece p of the
    first half beside piece p-1 of the second, and no phase starts before the last one ended.
    prioritise: each half runs its projections on a high-priority stream and its attention on a
    low-priority one, so that the block scheduler serves the short kernels first."""
    main = torch.cuda.current_stream()
    if prioritise:
        low, high = sorted(torch.cuda.Stream.priority_range(), reverse=True)  # lower number, higher priority
        streams = [(torch.cuda.Stream(priority=high), torch.cuda.Stream(priority=low)) for _ in halves]
    else:
        streams = [(s, s) for s in (torch.cuda.Stream(), torch.cuda.Stream())]
    gens = [segments(model, backend, h, kv_caches) for h in halves]
    done: list[list[torch.cuda.Event]] = [[], []]
    hidden: list[torch.Tensor | None] = [None, None]
    for pair in streams:
        for s in pair:
            s.wait_stream(main)
    phase = 0
    while hidden[0] is None or hidden[1] is None:
        for which, piece in ((0, phase), (1, phase - 1)):
            if piece < 0 or hidden[which] is not None:
                continue
            stream = streams[which][piece % 2]  # even pieces: projections and norms; odd: attention
            with torch.cuda.stream(stream):
                if piece > 0:
                    stream.wait_event(done[which][piece - 1])
                if barrier:
                    other = done[1 - which]
                    wait = piece - 1 if which == 0 else piece
                    if 0 <= wait < len(other):
                        stream.wait_event(other[wait])
                try:
                    next(gens[which])
                except StopIteration as finished:
                    hidden[which] = finished.value
                event = torch.cuda.Event()
                event.record(stream)
                done[which].append(event)
        phase += 1
    for pair in streams:
        for s in pair:
            main.wait_stream(s)
    return torch.cat(hidden)


def without_attention(model, backend, half: Half, kv_caches) -> torch.Tensor:
    gen = segments(model, backend, half, kv_caches, attention=False)
    while True:
        try:
            next(gen)
        except StopIteration as finished:
            return finished.value


def step_graph(fn) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_point(model, backend, kv_caches, contexts: np.ndarray, rng: np.random.Generator) -> list[dict]:
    num_blocks = kv_caches[0][0].shape[0]
    need = -(-contexts // BLOCK_SIZE)
    ids = rng.permutation(num_blocks)[: need.sum()]
    tables = np.split(ids, np.cumsum(need)[:-1])
    order = rng.permutation(len(contexts))  # halves of about equal total context
    first, second = order[: len(order) // 2], order[len(order) // 2:]
    kvh = model.num_kv_heads
    whole = Half(contexts, tables, kvh, "cuda")
    halves = [Half(contexts[idx], [tables[i] for i in idx], kvh, "cuda") for idx in (first, second)]

    def logits_of(hidden):
        return model.compute_logits(hidden, upcast=False).argmax(-1)

    variants = {
        "one": lambda: logits_of(model(whole.ids, whole.positions, kv_caches, whole.meta)),
        "free": lambda: logits_of(run_halves(model, backend, halves, kv_caches, barrier=False)),
        "pingpong": lambda: logits_of(run_halves(model, backend, halves, kv_caches, barrier=True)),
        "free_prio": lambda: logits_of(run_halves(model, backend, halves, kv_caches, False, prioritise=True)),
        "pingpong_prio": lambda: logits_of(run_halves(model, backend, halves, kv_caches, True, prioritise=True)),
        "no_attention": lambda: logits_of(without_attention(model, backend, whole, kv_caches)),
        "attention_only": lambda: [backend.forward(torch.zeros(len(contexts), model.model.layers[0].self_attn.num_heads,
                                                               model.head_dim, dtype=torch.bfloat16, device="cuda"),
                                                   None, None, *kv, whole.meta, 0.1) for kv in kv_caches],
    }
    # the halves must compute what the whole batch does (row order: first half, then second)
    reference = model(whole.ids, whole.positions, kv_caches, whole.meta)[torch.from_numpy(np.concatenate([first, second])).cuda()]
    error = max((run_halves(model, backend, halves, kv_caches, True, prioritise) - reference).abs().max().item()
                for prioritise in (False, True))
    rows = []
    for name, fn in variants.items():
        graph, _ = step_graph(fn)
        rows.append({"variant": name, "ms": bench(graph.replay)})
        del graph
    kv_bytes = int(contexts.sum()) * 2 * kvh * model.head_dim * 2 * model.num_layers
    return [dict(row, batch=len(contexts), total_context=int(contexts.sum()), kv_gb=kv_bytes / 1e9,
                 halves_max_abs_error=error, hidden_max_abs=reference.abs().max().item()) for row in rows]


BENCH_DECODE_STEPS = 1024  # the longest output: every step from 0 to 1,023 decodes


def summary(frame: pd.DataFrame) -> str:
    """The per-point table, and the bench's decode time per variant (the measured points
    interpolated over every step) beside its floors at the read ceiling: the K/V each step reads,
    and the weights (layers and LM head) each step reads."""
    from engine.core.model_shapes import model_shape
    from sim.specs import ModelSpec

    wide = frame.pivot_table(index=["step", "batch", "kv_gb"], columns="variant", values="ms")
    kv_gb = wide.index.get_level_values("kv_gb")
    wide["attn_tb_s"] = kv_gb / wide["attention_only"]  # GB per ms
    steps, every = wide.index.get_level_values("step"), np.arange(BENCH_DECODE_STEPS)
    totals = {v: round(float(np.interp(every, steps, wide[v]).sum()) / 1e3, 3) for v in wide.columns if v != "attn_tb_s"}
    read = float(frame.read_tb_s.iloc[0])
    model = ModelSpec.from_shape(model_shape(frame.preset.iloc[0]))
    weights_gb = (model.body_params_per_rank() + model.lm_head_params()) * model.dtype_bytes / 1e9
    floors = {"kv_s": float(np.interp(every, steps, kv_gb).sum()) / read / 1e3,
              "weights_s": BENCH_DECODE_STEPS * weights_gb / read / 1e3}
    return (f"{wide.round(3).to_string()}\n\nceilings, TB/s: copy {frame.copy_tb_s.iloc[0]:.3f}, read {read:.3f}\n"
            f"bench decode, s: {totals}\nfloors at the read ceiling, s: "
            f"{ {k: round(v, 3) for k, v in floors.items()} } ({weights_gb:.2f} GB of weights a step)\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="output folder (required unless --summarize)")
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--num-blocks", type=int, default=900)
    parser.add_argument("--summarize", type=Path, help="print the summary of a CSV this probe wrote; no GPU")
    args = parser.parse_args(argv)
    if args.summarize is not None:
        print(summary(pd.read_csv(args.summarize)))
        return
    if args.out is None:
        parser.error("--out is required to run the probe")
    args.out.mkdir(parents=True, exist_ok=True)
    ceilings = {"copy_tb_s": copy_ceiling() / 1e12, "read_tb_s": read_ceiling() / 1e12}
    print(ceilings, flush=True)
    model, backend = build_model(args.preset)
    kv_caches = model.make_kv_caches(args.num_blocks, BLOCK_SIZE)
    for k, v in kv_caches:
        k.normal_()
        v.normal_()
    rng = np.random.default_rng(1)
    rows = []
    with torch.inference_mode():
        for step, contexts in bench_batches():
            rows += [dict(r, step=step) for r in time_point(model, backend, kv_caches, contexts, rng)]
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows).assign(preset=args.preset, **ceilings)
    frame.to_csv(args.out / f"two_batch_{args.preset}.csv", index=False)
    text = summary(frame)
    (args.out / f"two_batch_{args.preset}.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
