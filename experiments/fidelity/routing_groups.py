"""Add the routing groups (sim.features.ROUTING_GROUPS) to a profile recorded before the profiler
wrote them, by building the grid's plans again on the CPU (harness.calibration.grid: the same
seed, scheduler and pool give the same shapes) and matching each row to its plan by its features.

    python experiments/fidelity/routing_groups.py experiments/fidelity/h100_30b_r2/qwen3-30b-a3b/profile.csv.gz \
        --max-model-len 16384 --max-num-batched-tokens 16384 --max-num-seqs 512 --num-blocks 401 \
        --block-size 256 --vocab-size 151936 --out experiments/fidelity/h100_30b_r2/shared/profile.csv.gz

Refuses in one line where a row matches no plan or plans of another grouping (another grid).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.config import SchedulerConfig
from engine.core.plan import KVCacheSpec
from harness.calibration.grid import ProfileGrid, build_plan
from harness.convert import ConfigError
from harness.scripting import one_line_errors
from sim.features import ROUTING_GROUPS, routing_sequences, step_features

KEY = ("kind", "num_seqs", "num_prefill_tokens", "prefill_context_tokens", "decode_context_tokens",
       "decode_repeated_tokens", "prefill_repeated_tokens")


def plan_groups(sched: SchedulerConfig, spec: KVCacheSpec, vocab_size: int) -> dict[tuple, int]:
    """Each grid shape's key (KEY) -> its routing groups; a key of two groupings maps to -1."""
    grid = ProfileGrid()
    rng = np.random.default_rng(grid.seed)
    groups: dict[tuple, int] = {}
    for _, kind, entries in list(grid.shapes(sched, rng, spec)):
        plan = build_plan(entries, spec, sched, rng, vocab_size)
        if plan is None:
            continue
        features = {"kind": kind, **step_features(plan)}
        key = tuple(features[name] for name in KEY)
        count = len(routing_sequences(plan))
        groups[key] = count if groups.get(key, count) == count else -1
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    for name in ("max-model-len", "max-num-batched-tokens", "max-num-seqs", "num-blocks", "block-size", "vocab-size"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def run() -> int:
        sched = SchedulerConfig(policy="mixed", max_num_seqs=args.max_num_seqs,
                                max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len)
        groups = plan_groups(sched, KVCacheSpec(args.num_blocks, args.block_size), args.vocab_size)
        table = pd.read_csv(args.profile)
        found = [groups.get(tuple(row), 0) for row in table[list(KEY)].itertuples(index=False)]
        bad = [i for i, g in enumerate(found) if g < 1]
        if bad:
            raise ConfigError(f"profile: {len(bad)} rows of {args.profile} match no single grid plan (first: row "
                              f"{bad[0]}); give the scheduler and pool the grid was profiled with")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.assign(**{ROUTING_GROUPS: found}).to_csv(args.out, index=False)
        print(f"{args.out}: {len(table)} rows, {sum(g < n for g, n in zip(found, table['num_seqs'], strict=True))} "
              f"with sequences over a shared prefix")
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
