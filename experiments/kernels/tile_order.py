"""The prefill attention kernel launched through a tile map (as a prefill CUDA graph launches it) in
the order its grid starts the programs, against the same kernel launched directly (as an eager step
does), on one GPU, side by side in one run.

The map lists query tiles longest first (kernels.prefill_tiles.query_tiles). Its grid is (KV heads,
map entries), so every head's program of a long tile starts before any shorter tile's;
--baseline FILE times a copy of the kernel module whose grid is (map entries, KV heads), head
after head, for the comparison (e.g. `git show <commit>:kernels/prefill_attention.py > FILE`).
Each shape's outputs must agree between the launches: the order moves programs, not arithmetic.

    python -m experiments.kernels.tile_order --out $OUT/tile_order [--baseline FILE]   # on a GPU, < 60 s

Writes kernel.csv: per shape (sequences, chunk tokens, cached tokens a sequence), query heads and
launch ("eager", "map", "map_baseline"), the median microseconds of one launch as a CUDA-graph
replay with L2 cleared, and the largest absolute difference of its output from the eager launch's.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pandas as pd

KV_HEADS = 8
# (sequences, chunk tokens, cached tokens a sequence): one fresh prompt of each size the engine's
# prefill graphs take, batches of shorter prompts, and chunks after a cached context
SHAPES = [(1, n, 0) for n in (512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)] + [
    (4, 1024, 0), (16, 256, 0), (64, 64, 0), (1, 256, 8192), (8, 512, 2048), (2, 2048, 4096)]
HEADS = (16, 32)  # Qwen3-0.6B's query heads, Qwen3-8B's (both 8 KV heads)


def load_baseline(path: Path):
    """The kernel module at `path`, imported under its own name beside kernels.prefill_attention."""
    spec = importlib.util.spec_from_file_location("prefill_attention_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: --baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_shape(seqs: int, chunk: int, cached: int, heads: int, kernels: dict) -> list[dict]:
    """One row per launch of this shape: microseconds and the output's difference from eager."""
    from experiments.kernels.prefill_balance import paged_inputs
    from experiments.kernels.timing import bench_graph

    inputs = paged_inputs(seqs, chunk, cached, heads, KV_HEADS)
    tiles = inputs.pop("map")
    rows, reference = [], None
    for launch, (attend, mapped) in kernels.items():
        def run(attend=attend, mapped=mapped):
            return attend(**inputs, tiles=tiles if mapped else None)
        out = run()
        reference = out if reference is None else reference
        rows.append({"seqs": seqs, "chunk": chunk, "cached": cached, "heads": heads, "launch": launch,
                     "us": 1e3 * bench_graph(run), "max_abs_diff": float((out - reference).abs().max())})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a copy of the kernel module whose tile-map grid runs head after head")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device")
    from kernels.prefill_attention import paged_prefill_attention

    kernels = {"eager": (paged_prefill_attention, False), "map": (paged_prefill_attention, True)}
    if args.baseline is not None:
        kernels["map_baseline"] = (load_baseline(args.baseline).paged_prefill_attention, True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for heads in HEADS:
        for seqs, chunk, cached in SHAPES:
            rows += time_shape(seqs, chunk, cached, heads, kernels)
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "kernel.csv", index=False)
    wide = table.pivot_table(index=["heads", "seqs", "chunk", "cached"], columns="launch", values="us")
    for launch in wide.columns.drop("eager"):
        wide[f"{launch}/eager"] = wide[launch] / wide["eager"]
    print(wide.round(3).to_string())
    worst = table["max_abs_diff"].max()
    print(f"largest output difference from the eager launch: {worst:g}")
    return 0 if worst == 0.0 else 1


if __name__ == "__main__":
    sys.exit(main())
