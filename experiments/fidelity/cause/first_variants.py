"""Which steps of a held-out call first met a fused-MoE kernel variant under Triton's old
specialisation of the route/align kernels' integer arguments (docs/moe-warmup.md): the call's
cells simulated in the engine process's order (start-up's warm-up and graph capture, then per
class: the unmeasured offline warm-up, the offline cell, each load cell, two repeats each); every
eager step's variants (tiles, and the divisibility-by-16 / equal-to-1 key of each token-count
argument) are replayed, and each first-met variant after start-up is printed. The simulator's
offline schedules are the engine's (schedules.csv); load cells' are close, not identical, so
--counts lists token counts the engine ran (its replays) to check against the steps before them.

    cp ../shared/traces/azure_conv_2023.csv .   # the conversation class reads it from the cwd
    python experiments/fidelity/cause/first_variants.py --counts 6030,6155 \\
        > experiments/fidelity/h100_30b_r5/first_variants.txt
"""

from __future__ import annotations

import argparse
import warnings

import pandas as pd

from engine.core.config import SchedulerConfig
from engine.core.graph_sizes import decode_graph_sizes, prefill_graph_sizes
from engine.kv_sizing import warmup_plans
from harness.fidelity import classes
from harness.run import run_once
from harness.scripting import compose_run_config
from kernels.moe_align import align_capacity, num_programs, scans, tokens_per_program
from kernels.moe_configs import tiles_for

DEVICE, TOP_K, EXPERTS, INTER = "NVIDIA H100 80GB HBM3", 8, 128, 768  # Qwen3-30B-A3B on the call's GPU
RATES = {"prefill_heavy": (3.547847, 5.676556), "shared_prefix": (4.718669, 7.549870),  # r5 heldout.csv
         "conversation": (4.830584, 7.728935)}


def spec(value: int) -> str:
    """Triton's key of an unannotated int argument: '1', 'D' (divisible by 16) or '-'."""
    return "1" if value == 1 else "D" if value % 16 == 0 else "-"


def old_variants(tokens: int) -> set[tuple]:
    """The variants a routed fused-MoE call of `tokens` tokens compiled before do_not_specialize."""
    tiles = tiles_for(tokens, TOP_K, EXPERTS, INTER, "bfloat16", DEVICE)
    bm, pairs = tiles.block_m, tokens * TOP_K
    chunk = tokens_per_program(TOP_K) * TOP_K
    cap = align_capacity(pairs, EXPERTS, bm)
    programs = num_programs(pairs, EXPERTS, bm, chunk)
    out = {("gemm", tiles), ("route", spec(tokens), spec(cap))}
    if scans(programs):
        out.add(("scan", spec(programs)))
    out.add(("scatter", bm, scans(programs), spec(pairs), spec(programs), spec(cap // bm)))
    return out


def simulated_cells(name: str, profile: str) -> list[tuple[str, list[int]]]:
    """(cell, eager steps' token counts) in process order, each measured cell twice."""
    rc = compose_run_config(["backend=sim", "model=qwen3-30b-a3b", "hardware=h100", "backend.cost_model=profiled",
                             f"backend.profile_path={profile}", "scheduler.max_model_len=16384",
                             "cache.num_blocks=401"])  # the call's KV cache
    base = classes.class_run_config(rc, name, 40, 1.0)
    cells = [("warm-up", base), ("offline #0", base), ("offline #1", base)]
    for load, rate in zip((0.5, 0.8), RATES[name]):
        cells += [(f"{load} #{i}", classes.with_rate(base, name, rate)) for i in range(2)]
    out, runs = [], {}
    for label, cell in cells:
        key = (label.split(" #")[0], cell.workload.rate)  # a repeat is the same simulated run
        if key not in runs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                steps = pd.DataFrame(run_once(cell, False, record=True).steps)
            runs[key] = steps[~steps.cuda_graph.astype(bool)].num_tokens.tolist()
        out.append((f"{name} {label}", runs[key]))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", default="prefill_heavy,shared_prefix,conversation")
    parser.add_argument("--profile", default="experiments/fidelity/h100_30b_r2/shared/profile.csv.gz")
    parser.add_argument("--counts", default="", help="engine token counts to check at repeat 0 of each load cell")
    parser.add_argument("--counts-class", default="prefill_heavy", help="the class whose load cells --counts checks")
    args = parser.parse_args(argv)
    seen: set[tuple] = set()
    sched = SchedulerConfig(max_model_len=16384)
    startup = [p.stats.num_prefill_tokens + p.stats.num_decode_tokens for p in warmup_plans(sched, 256)]
    startup += list(prefill_graph_sizes(4096)) + list(decode_graph_sizes(512, 512))
    for tokens in startup:
        seen |= old_variants(tokens)
    print(f"start-up (warm-up steps and graph capture): {len(seen)} variants")
    counts = [int(c) for c in args.counts.split(",") if c]
    for name in args.classes.split(","):
        for label, tokens_list in simulated_cells(name, args.profile):
            check = name == args.counts_class and label.endswith(("0.5 #0", "0.8 #0"))
            for c in counts if check else []:
                print(f"{label}: an engine step of {c} tokens here would compile "
                      f"{sorted(map(str, old_variants(c) - seen)) or 'nothing'}")
            for tokens in tokens_list:
                new = old_variants(tokens) - seen
                if new:
                    print(f"{label}: eager step of {tokens} tokens first met {sorted(map(str, new))}")
                seen |= new
    print(f"after the call: {len(seen)} variants")


if __name__ == "__main__":
    main()
