"""A mixture-of-experts cell's decode steps priced with each rule for the routing of sequences
over one prefix, against the engine's measured times. No GPU needed.

An offline cell is simulated step by step (its schedule is the engine's, step for step:
schedules.csv), recording each step's sequences and their routing groups; for a load cell, whose
schedule the simulation does not repeat step for step, --prefix-tokens reads each step's groups
off its repeated KV reads instead (groups_from_repeats). Each step of the engine's replay
(fidelity.steps_dir) is then priced with the expected distinct experts of:

- apart: every sequence on its own (shared-prefix routing off);
- block, one sequence: sequences whose block tables start with one physical block as one sequence
  at the locality (the rule before sequences were grouped by their first tokens);
- tokens, one sequence: sequences that start with the same tokens (sim.features.routing_sequences)
  as one sequence;
- tokens, fitted: the same groups priced by sim.moe_groups at the given figures;

and the count its measured time implies under the profiled fit (its price of an expert at that
step). Printed by decode batch: mean sequences, groups and counts, measured ms per step and each
rule's error.

    R=experiments/fidelity; C=<call>/qwen3-30b-a3b/shared_prefix-conversation
    python -m experiments.fidelity.cause.routing_steps $R/h100_30b_r4/shared_prefix-conversation/heldout.csv.gz \\
        $R/h100_30b_r2/qwen3-30b-a3b/profile_model.csv $C/steps/shared_prefix_offline_0.csv.gz \\
        --workload shared_prefix --model qwen3-30b-a3b --hardware h100 --num-blocks 401 --num-requests 40 \\
        --moe-routing-skew 0.379 --moe-routing-locality 1.9954 --moe-routing-shared-fresh 0.062 \\
        --moe-routing-shared-cap 3   # then $C/steps/shared_prefix_0.5_0.csv.gz ... --prefix-tokens 1024
"""

from __future__ import annotations

import dataclasses
import sys
import warnings

import numpy as np
import pandas as pd

from engine.core.graph_sizes import planned_graph_sizes
from experiments.fidelity.cause.host_scales import replay_steps
from experiments.fidelity.cause.resimulated_cell import base_config, cell_parser
from experiments.fidelity.resimulate import cell_config
from harness.compare.study import sim_run_config
from harness.run import run_once
from sim import build_sim_executor
from sim.cost_model import make_cost_model
from sim.features import (
    graph_padded,
    read_sequences,
    routing_sequences,
    row_routing_sequences,
    row_sequences,
    step_features,
)
from sim.moe_locality import SequenceRouting

RULES = ("apart", "block_one", "tokens_one", "tokens_fit")
BATCH_EDGES = (0, 8, 16, 32, 64, 128, 256, 512)


def cell_cost(args):
    """The offline cell's run configuration (simulated step by step) and its cost model."""
    base = base_config(args.model, args.hardware)
    rc = cell_config(base, args.workload, "offline", 0.0, args.num_requests, None)
    meta = {"num_blocks": args.num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [],
            "async_scheduling": True, "moe_routing_skew": args.moe_routing_skew,
            "moe_routing_locality": args.moe_routing_locality}
    rc = sim_run_config(rc, "profiled", str(args.profile), meta)
    rc = dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, execution=base.sim.execution, fast_forward=False))
    graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens,
                                 max_model_len=rc.scheduler.max_model_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rc, make_cost_model(rc.model, rc.hardware, rc.sim, graphs)


def simulated_groups(args):
    """Each simulated step's sequences and routing groups (by first block and by first tokens), and
    the cell's cost model."""
    rc, cost = cell_cost(args)
    rows = []
    priced = cost.step_time

    def step_time(plan):
        f = step_features(plan, cost.graphs)
        blocks: dict[int, list[int]] = {}
        for e in plan.scheduled:
            blocks.setdefault(e.block_table[0] if e.block_table else -1 - len(blocks), []).append(len(e.token_ids))
        rows.append({"step": plan.stats.step, "sim_seqs": len(plan.scheduled),
                     "sizes": [len(e.token_ids) for e in plan.scheduled],
                     "blocks": [sum(g) for g in blocks.values()], "tokens": routing_sequences(plan),
                     "padded": graph_padded(f["cuda_graph"], f["graph_batch_size"], f["num_tokens"])})
        return priced(plan)

    cost.step_time = step_time  # type: ignore[method-assign]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
        run_once(rc, False, executor=executor)
    return pd.DataFrame(rows), cost, rc.model


def groups_from_repeats(replay: pd.DataFrame, prefix_tokens: int) -> pd.DataFrame:
    """Each replayed step's sequences and routing groups where every shared prefix is prefix_tokens
    long in whole blocks (the shared_prefix class): a decode step's groups are its sequences less
    its repeated KV reads over prefix_tokens (engine.core.kv_reads counts a block once per read
    after the first), their decodes evened over them (sim.features.row_routing_sequences); blocks
    and first tokens cannot be told apart here. Other steps: every sequence apart."""
    rows = []
    for row in replay.to_dict("records"):
        sizes = row_sequences(row["num_prefill_tokens"], row["num_decode_tokens"], row["num_seqs"])
        groups = [(n,) for n in sizes]
        if row["kind"] == "decode":
            count = max(int(row["num_seqs"]) - int(row["decode_repeated_tokens"]) // prefix_tokens, 1)
            groups = row_routing_sequences(0, int(row["num_decode_tokens"]), int(row["num_seqs"]), count)
        rows.append({"step": row["step"], "sim_seqs": row["num_seqs"], "sizes": sizes, "tokens": groups,
                     "blocks": [sum(g) for g in groups],
                     "padded": graph_padded(row["cuda_graph"], row["graph_batch_size"], row["num_tokens"])})
    return pd.DataFrame(rows)


def counts(groups: pd.DataFrame, model, args) -> pd.DataFrame:
    """Each step's expected distinct experts under each rule (module docstring)."""
    e, k = model.num_experts, model.num_experts_per_tok
    one = SequenceRouting(e, k, args.moe_routing_skew, args.moe_routing_locality)
    fit = SequenceRouting(e, k, args.moe_routing_skew, args.moe_routing_locality, args.moe_routing_shared_fresh,
                          args.moe_routing_shared_cap)
    out = {"apart": [one.distinct(read_sequences(s, p)) for s, p in zip(groups["sizes"], groups["padded"])],
           "block_one": [one.distinct(read_sequences(s, p)) for s, p in zip(groups["blocks"], groups["padded"])],
           "tokens_one": [one.distinct(read_sequences(s, p)) for s, p in zip(groups["tokens"], groups["padded"])],
           "tokens_fit": [fit.distinct(read_sequences(s, p)) for s, p in zip(groups["tokens"], groups["padded"])]}
    return groups.assign(block_groups=groups["blocks"].map(len), token_groups=groups["tokens"].map(len), **out)


def priced(replay: pd.DataFrame, steps: pd.DataFrame, cost) -> pd.DataFrame:
    """The replay's steps priced under each rule, and the count each one's measured time implies."""
    def price(column) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cost.predict(steps.assign(moe_distinct_experts=np.asarray(column, dtype=float)), include_host=True)

    out = replay.copy()
    for rule in RULES:
        out[f"priced_{rule}"] = price(replay[rule])
    lower = price(replay["apart"] - 10.0)
    slope = (out["priced_apart"] - lower) / 10.0  # the fit's price of one more expert at the step
    out["implied"] = replay["apart"] + (replay["measured_s"] - out["priced_apart"]) / slope
    return out


def summary(table: pd.DataFrame) -> pd.DataFrame:
    decodes = table[table["kind"] == "decode"]
    batch = pd.cut(decodes["num_seqs"], BATCH_EDGES)
    batch = batch.cat.remove_unused_categories().astype(str).astype(
        pd.CategoricalDtype([str(c) for c in batch.cat.remove_unused_categories().cat.categories] + ["all decodes"],
                            ordered=True))
    agg = {"steps": ("step", "size"), "seqs": ("num_seqs", "mean"), "block_groups": ("block_groups", "mean"),
           "token_groups": ("token_groups", "mean"), **{rule: (rule, "mean") for rule in RULES},
           "implied": ("implied", "mean"), "measured_ms": ("measured_s", "mean")}
    out = decodes.assign(batch=batch).groupby("batch", observed=True).agg(**agg)
    totals = decodes.assign(batch="all decodes").groupby("batch").agg(**agg)
    sums = pd.concat([decodes.assign(batch=batch), decodes.assign(batch="all decodes")]).groupby("batch", observed=True)
    for rule in RULES:
        errors = sums[f"priced_{rule}"].sum() / sums["measured_s"].sum() - 1.0
        out[f"err_{rule}"], totals[f"err_{rule}"] = errors, errors["all decodes"]
    out = pd.concat([out, totals])
    out["measured_ms"] *= 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    parser = cell_parser(__doc__)
    parser.add_argument("replay", help="the cell's replay (<class>_<load>_<repeat>.csv.gz): offline, or any load "
                                           "with --prefix-tokens")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--moe-routing-skew", type=float, required=True)
    parser.add_argument("--moe-routing-locality", type=float, required=True)
    parser.add_argument("--moe-routing-shared-fresh", type=float, required=True)
    parser.add_argument("--moe-routing-shared-cap", type=int, default=None)
    parser.add_argument("--prefix-tokens", type=int, default=None,
                        help="every shared prefix's length (whole blocks): the groups read off each replayed step's "
                             "repeated KV reads (groups_from_repeats), for a cell whose schedule the simulation "
                             "does not repeat step for step (a load cell)")
    args = parser.parse_args(argv)
    if args.prefix_tokens is not None:
        rc, cost = cell_cost(args)
        model = rc.model
        groups = groups_from_repeats(pd.read_csv(args.replay), args.prefix_tokens)
    else:
        groups, cost, model = simulated_groups(args)
    replay = pd.read_csv(args.replay).merge(counts(groups, model, args), on="step", how="left")
    differ = replay["sim_seqs"] != replay["num_seqs"]
    if differ.any():
        step = int(replay.loc[differ, "step"].iloc[0])
        print(f"error: the simulated schedule differs from the replay's at step {step} (an offline cell's replays "
              "line up step for step)", file=sys.stderr)
        return 2
    print(summary(priced(replay, replay_steps(args.replay), cost)).round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
