"""Does the decode kernel read the KV cache faster when its programs are shorter?

The balanced rule (kernels.decode_split.balanced_chunk) gives every program about the batch's mean
context once the batch has two programs per SM, so a batch of 140 ragged sequences runs in about
three waves of programs of very different lengths, and the last wave leaves SMs idle. Shorter
pieces make the waves finer at the price of more partials to merge. This times the kernel
(CUDA-graph replay, L2 cleared) on ragged Qwen3-0.6B batches (16 query / 8 KV heads, d 128,
256-token pages, contexts uniform in 100-2,000) with the engine's chunk and with that chunk cut by
2, 4 and 8, for two tile shapes, and reports the read bandwidth beside the read-only ceiling.

    python -m experiments.kernels.decode_chunks --out $OUT/decode_chunks
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np
import torch

import kernels.decode_attention as decode
from experiments.kernels.timing import bench_graph, decode_bandwidth_table
from kernels.decode_split import balanced_chunk

HEADS, KV_HEADS, HEAD_DIM, PAGE, MAX_CONTEXT = 16, 8, 128, 256, 2000
BATCHES = (32, 64, 140, 256)
DIVISORS = (1, 2, 4, 8)
TILES = ((64, 4, 2), (128, 4, 3))  # block_n, warps, stages


@dataclass
class RaggedBatch:
    """A decode batch over a random bf16 cache, its pages shuffled, contexts uniform in 100-MAX_CONTEXT."""

    lens: np.ndarray
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    tables: torch.Tensor
    seq_lens: torch.Tensor

    @staticmethod
    def make(batch: int, rng: np.random.Generator) -> RaggedBatch:
        lens = rng.integers(100, MAX_CONTEXT + 1, size=batch)
        blocks = -(-MAX_CONTEXT // PAGE)
        k_cache = torch.randn(batch * blocks, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        return RaggedBatch(
            lens, torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16), k_cache,
            torch.randn_like(k_cache),
            torch.randperm(batch * blocks, device="cuda", dtype=torch.int32).view(batch, blocks),
            torch.tensor(lens, dtype=torch.int32, device="cuda"),
        )  # fmt: skip

    @property
    def read_bytes(self) -> int:
        """K and V of every context token, once."""
        return 2 * int(self.lens.sum()) * KV_HEADS * HEAD_DIM * self.k_cache.element_size()

    def time(self, call, reference: torch.Tensor) -> dict:
        """One CUDA-graph replay of call: us, read bandwidth, and its largest difference from
        reference; NaN where the call does not compile (a shared-memory limit, say), reported."""
        try:
            error = (call().float() - reference.float()).abs().max().item()
            ms = bench_graph(call)
        except Exception as exc:  # noqa: BLE001 - one failing config must not end the sweep
            print(f"batch {len(self.lens)}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            error, ms = float("nan"), float("nan")
        return {"us": ms * 1e3, "read_tb_s": self.read_bytes / (ms * 1e-3) / 1e12, "max_abs_error": error}


def one_batch(batch: int, rng: np.random.Generator) -> list[dict]:
    b = RaggedBatch.make(batch, rng)
    lens, q, k_cache, v_cache, tables, seq_lens = b.lens, b.q, b.k_cache, b.v_cache, b.tables, b.seq_lens
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    engine_chunk = balanced_chunk(lens, KV_HEADS, sms)
    arrivals = decode.DecodeArrivals()
    reference = decode.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, HEAD_DIM**-0.5, num_splits=1)
    rows = []
    for divisor, (block_n, warps, stages) in product(DIVISORS, TILES):
        chunk = max(block_n, -(-engine_chunk // divisor // block_n) * block_n)
        splits = -(-MAX_CONTEXT // chunk)  # room for the longest context to be cut into such pieces
        chunk_tensor = torch.tensor([chunk], dtype=torch.int32, device="cuda")

        def call(bn=block_n, w=warps, s=stages, c=chunk_tensor, n=splits):
            return decode.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, HEAD_DIM**-0.5,
                                                 num_splits=n, split_chunk=c, block_n=bn, num_warps=w,
                                                 num_stages=s, arrivals=arrivals.get(batch * KV_HEADS, q.device))

        rows.append({"batch": batch, "divisor": divisor, "chunk": chunk, "splits": splits,
                     "tile": f"{block_n}/{warps}/{stages}", **b.time(call, reference)})
    return rows


def main(argv: list[str] | None = None) -> None:
    frame, ceiling, out = decode_bandwidth_table(argv, __doc__.splitlines()[0], one_batch, BATCHES, "decode_chunks",
                                                 ceiling="read")
    wide = frame.pivot_table(index=["batch", "tile"], columns="divisor", values="us")
    text = (f"read ceiling {ceiling:.2f} TB/s, {torch.cuda.get_device_name()}\n{frame.to_string(index=False)}\n\n"
            f"us by chunk divisor (1: the engine's chunk):\n{wide.round(1).to_string()}\n")
    (out / "decode_chunks.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
