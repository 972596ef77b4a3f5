"""One decode-attention launch on a ragged batch, for Nsight Compute to read its counters.

Runs kernels.decode_attention with the engine's balanced chunk on the same kind of batch as
decode_chunks.py (Qwen3-0.6B heads, 256-token pages, contexts uniform in 100-2,000) a few times,
so that a profiler can skip the compiling launches:

    ncu --clock-control none -k regex:_decode_split_kernel --launch-skip 3 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \\
        --section WarpStateStats --section LaunchStats \\
        python -m experiments.kernels.decode_ncu --batch 140
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import kernels.decode_attention as decode
from experiments.kernels.decode_chunks import HEAD_DIM, KV_HEADS, RaggedBatch
from kernels.decode_split import balanced_chunk


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=140)
    parser.add_argument("--launches", type=int, default=5)
    args = parser.parse_args(argv)
    b = RaggedBatch.make(args.batch, np.random.default_rng(0))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chunk = torch.tensor([balanced_chunk(b.lens, KV_HEADS, sms)], dtype=torch.int32, device="cuda")
    for _ in range(args.launches):
        decode.paged_decode_attention(b.q, b.k_cache, b.v_cache, b.tables, b.seq_lens, HEAD_DIM**-0.5,
                                      max_seq_len_hint=4096, split_chunk=chunk)
    torch.cuda.synchronize()
    print(f"batch {args.batch}: {int(b.lens.sum())} keys, {b.read_bytes / 1e6:.0f} MB of K/V")


if __name__ == "__main__":
    main()
