"""Does a decode step's routing on random weights depend on what its context's KV blocks hold?

On the CPU, Qwen3-30B-A3B's shape (48 layers, 128 experts, top 8) with random weights
(load_format=dummy) and narrow experts (moe_intermediate_size 32: routing does not read the
experts' width), in bfloat16: decode steps of B sequences at three contexts, built as the profiling
grid builds them (harness.calibration.grid: disjoint blocks from the start of the pool, random
token ids), once on a KV pool of zeros and once after a prefill has written the pool's first
blocks; each step's distinct experts per MoE layer as the grid now records them
(harness.calibration.expert_steps). About 2 minutes and 5 GB of memory.

    python experiments/fidelity/routing_probe.py
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from engine import LLM
from engine.core.model_shapes import MODEL_SHAPES
from harness.calibration.expert_steps import ExpertTally
from harness.calibration.grid import build_plan
from sim.moe import ExpertRouting

BATCHES, CONTEXTS = (2, 8), (100, 300, 700)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    shape = dataclasses.replace(MODEL_SHAPES["qwen3-30b-a3b"], moe_intermediate_size=32, vocab_size=20000)
    llm = LLM(shape, load_format="dummy", device="cpu", dtype="bfloat16", max_model_len=4096, num_blocks=48,
              record_expert_counts=True, enable_prefix_caching=False)
    executor, sched = llm.executor, llm.scheduler_config
    info = executor.info()
    tally = ExpertTally.of(executor)
    assert tally is not None
    rng = np.random.default_rng(0)
    routing = ExpertRouting(shape.num_experts, shape.num_experts_per_tok, 0.0)

    def distinct(entries) -> float | None:
        plan = build_plan(entries, info.kv_cache_spec, sched, rng, info.vocab_size)
        if plan is None:  # past the pool
            return None
        tally.begin()
        executor.execute(plan)
        return round(tally.distinct(), 1)

    def sweep(label: str) -> None:
        for batch in BATCHES:
            row = {c: distinct([(1, int(x), True) for x in rng.integers(c // 2, c * 3 // 2 + 1, size=batch)])
                   for c in CONTEXTS}
            print(f"{label:16s} B={batch}: " + ", ".join(f"context {c}: {d}" for c, d in row.items())
                  + f" (independent routing: {routing.distinct(batch):.1f})", flush=True)

    sweep("KV zeros")
    distinct([(512, 0, False)] * 4)  # four prompts of 512 tokens write the first 8 blocks
    sweep("after a prefill")
    llm.shutdown()


if __name__ == "__main__":
    main()
