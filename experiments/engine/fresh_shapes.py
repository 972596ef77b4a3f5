"""Does an eager prefill cost more the first time the engine sees its token count? One prompt at a
time (max_tokens=1, prefix cache off), each request's wall time from generate(): a length repeated,
then fresh lengths near it, past the prefill graphs (eager) and under them (a CUDA graph, the
control). Writes fresh_shapes.csv and prints the medians.

    python3 experiments/engine/fresh_shapes.py --ckpt /tmp/ck/q06 --out $OUT
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from engine.core.sampling_params import SamplingParams
from engine.llm import LLM

TRIALS = 12


def timed(llm: LLM, length: int, rng: np.random.Generator) -> float:
    prompt = rng.integers(100, 10000, length).tolist()
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    llm = LLM(args.ckpt, max_model_len=16384, enable_prefix_caching=False)
    rng = np.random.default_rng(0)
    rows = []
    for base, path in ((6000, "eager"), (3000, "graph")):
        for _ in range(3):
            timed(llm, base, rng)  # warm the repeated length
        for trial in range(TRIALS):
            rows.append({"path": path, "shape": "repeated", "tokens": base, "seconds": timed(llm, base, rng)})
            fresh = base + 1 + 13 * trial + (1 if path == "eager" else 0)
            rows.append({"path": path, "shape": "fresh", "tokens": fresh, "seconds": timed(llm, fresh, rng)})
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "fresh_shapes.csv", index=False)
    print(table.groupby(["path", "shape"])["seconds"].describe()[["count", "50%", "min", "max"]].to_string())


if __name__ == "__main__":
    main()
