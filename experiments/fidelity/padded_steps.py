"""A mixture-of-experts call's per-step replays priced again with this checkout's rule for the
distinct experts of a served step (sim.features.read_sequences: a CUDA graph's padding rows route
as one more token), beside the price the call's replay recorded. Prints, per replay file,
step_groups.py's table for both prices, and the decode graph steps by graph size and whether the
graph was padded (a step of fewer sequences than its graph) or full: measured and priced
milliseconds per step. No GPU needed.

    python -m experiments.fidelity.padded_steps experiments/fidelity/h100_30b_r2/qwen3-30b-a3b/profile_model.csv \
        <call>/qwen3-30b-a3b/conversation/steps/*_0.csv.gz --model qwen3-30b-a3b \
        --moe-routing-skew 0.379 --moe-routing-locality 1.995
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

from experiments.fidelity.cause.host_scales import replay_steps
from experiments.fidelity.step_groups import step_groups
from harness.fidelity.steps import with_moe_experts
from sim.features import MOE_FEATURES, graph_padded
from sim.moe_locality import SequenceRouting
from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from sim.specs import ModelSpec

LABEL = "repriced"  # the replay column of this checkout's price: predicted_repriced_s


def repriced(path: Path, model: ProfiledCostModel, routing: SequenceRouting) -> pd.DataFrame:
    """The replay with predicted_<LABEL>_s: its steps priced with the expected experts this
    checkout derives (the replay's own column dropped), the host as the profile measured it."""
    replay = pd.read_csv(path)
    steps = with_moe_experts(replay_steps(path).drop(columns=list(MOE_FEATURES)), routing.distinct)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)  # a held-out class leaves the grid's range
        replay[f"predicted_{LABEL}_s"] = model.predict(steps, include_host=True)
    return replay


def decode_graphs(replay: pd.DataFrame, cost_model: str) -> pd.DataFrame:
    """Decode graph steps by (graph size, padded): steps, mean sequences, ms per step measured and
    priced by the replay's cost model and by this checkout, and the two errors."""
    steps = replay[(replay["kind"] == "decode") & (replay["cuda_graph"] == 1)]
    padded = [graph_padded(1, g, n) for g, n in zip(steps["graph_batch_size"], steps["num_seqs"], strict=True)]
    table = steps.assign(padded=padded).groupby(["graph_batch_size", "padded"]).agg(
        steps=("step", "size"), seqs=("num_seqs", "mean"), measured_ms=("measured_s", "mean"),
        replay_ms=(f"predicted_{cost_model}_s", "mean"), repriced_ms=(f"predicted_{LABEL}_s", "mean"))
    table[["measured_ms", "replay_ms", "repriced_ms"]] *= 1e3
    table["err_replay"] = table["replay_ms"] / table["measured_ms"] - 1.0
    table["err_repriced"] = table["repriced_ms"] / table["measured_ms"] - 1.0
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="the profiled model the call priced with")
    parser.add_argument("replays", nargs="+", type=Path, help="replay files of a held-out call (fidelity.steps_dir)")
    parser.add_argument("--model", required=True, help="conf/model name (an MoE model)")
    parser.add_argument("--moe-routing-skew", type=float, required=True, help="the call's skew (its log)")
    parser.add_argument("--moe-routing-locality", type=float, default=0.0, help="the call's locality (its log)")
    parser.add_argument("--cost-model", default="profiled", help="the replay's cost model to compare with")
    args = parser.parse_args(argv)
    from engine.core.model_shapes import model_shape

    spec = ModelSpec.from_shape(model_shape(args.model))
    if not spec.is_moe:
        print(f"error: --model {args.model} is dense; this reprices a mixture-of-experts call", file=sys.stderr)
        return 2
    missing = [str(path) for path in args.replays if not path.is_file()]
    if missing:
        print(f"error: no such replay file: {', '.join(missing)}", file=sys.stderr)
        return 2
    routing = SequenceRouting(spec.num_experts, spec.num_experts_per_tok, args.moe_routing_skew,
                              args.moe_routing_locality)
    model = ProfiledCostModel.load(args.profile)
    for path in args.replays:
        replay = repriced(path, model, routing)
        groups = pd.concat({name: step_groups(replay, name)[["steps", "measured_s", "predicted_s", "err"]]
                            for name in (args.cost_model, LABEL)}, axis=1)
        print(f"{path.name}: step groups, as the replay priced them ({args.cost_model}) and repriced")
        print(groups.round(4).to_string())
        print("decode graph steps, padded or full")
        print(decode_graphs(replay, args.cost_model).round(4).to_string())
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
