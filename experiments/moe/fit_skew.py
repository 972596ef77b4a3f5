"""The routing skew an engine run measured: fit sim.moe's Zipf exponent to its expert counts.

    python experiments/moe/fit_skew.py experiments/moe/h200_run3/expert_counts_counts.csv.gz --top-k 8

Input: an expert_counts CSV (layer, expert, tokens; engine.expert_counts), written by a harness
engine run with backend.record_expert_counts=true or by bench_engine.py's `counts` variant.
Writes skew.json beside it: the skew of all layers together (what backend.moe_routing_skew takes),
each layer's own (min, median, max), the busiest expert's share of a layer's assignments against
the uniform 1/E, and the expected distinct experts per layer D(B) at a few batch sizes under
uniform routing and under the fitted skew (sim.moe.expected_distinct_experts).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sim.moe import expected_distinct_experts, fit_routing_skew, read_routing_counts

BATCHES = (1, 4, 16, 64, 140, 256)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counts", type=Path, help="expert_counts CSV (layer, expert, tokens)")
    parser.add_argument("--top-k", type=int, required=True, help="the model's num_experts_per_tok")
    args = parser.parse_args(argv)
    counts = read_routing_counts(args.counts)
    layers, experts = counts.shape
    skew = fit_routing_skew(counts, args.top_k)
    per_layer = [fit_routing_skew(row, args.top_k) for row in counts if row.sum() > 0]
    shares = counts.max(axis=1) / np.maximum(counts.sum(axis=1), 1)
    result = {
        "counts": str(args.counts), "layers": layers, "experts": experts, "top_k": args.top_k,
        "assignments_per_expert": float(counts.sum() / counts.size),
        "skew": skew,
        "skew_per_layer": {"min": float(np.min(per_layer)), "median": float(np.median(per_layer)),
                           "max": float(np.max(per_layer))},
        "busiest_expert_share": {"median": float(np.median(shares)), "max": float(shares.max()),
                                 "uniform": 1.0 / experts},
        "distinct_experts": {str(b): {"uniform": expected_distinct_experts(b, experts, args.top_k),
                                      "fitted": expected_distinct_experts(b, experts, args.top_k, skew)}
                             for b in BATCHES},
    }
    out = args.counts.parent / "skew.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
