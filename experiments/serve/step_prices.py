"""Where the simulator's prices of a served benchmark case differ from what the engine measured.

    python -m experiments.serve.step_prices PACK --case mooncake_80 [--profile CSV] [--trace-dir DIR] [--set K=V ...]

PACK: bench_serve's harness.tar.gz (or the folder it packs): plan.json names each case's run, and
<case>/requests.csv (and steps.csv.gz, kept since bench_serve keeps the engine's step tables) is the
engine's run. The same requests are simulated here (backend=sim, the profiled cost model of the
case's hardware, or --profile), and three things are compared:

1. prefix hits, request by request: equal cached_tokens mean the simulator's prefix cache hit
   what the engine's did (a hit-rate mismatch would price the steps apart for another reason);
2. with the engine's step table: every engine step priced by the model (its recorded features),
   by regime: steps, measured and priced sums, median relative error;
3. without one (packs made before it was kept), from requests.csv: prefill steps run back to back
   (a step planned while the one before was in flight: its span is the gap between their first
   tokens), priced from their requests' new and cached tokens; and the decode steps of requests
   whose whole decode ran with no prefill step beside it (their TPOT is their steps' mean),
   priced from the states the running set passes through (contexts grow one token a step; shared
   blocks from the prompts' chained block hashes and each request's cached tokens). Both are
   applied to the simulator's own run too, where they must find no error: that is their check.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.core.graph_sizes import GraphSizes, padded_size
from engine.core.request import Request
from harness.backends import BACKENDS
from harness.run import run_once
from harness.scripting import compose_run_config
from harness.workloads.build import build_workload
from harness.workloads.mooncake import chained_block_hashes
from sim.features import attention_pairs
from sim.profiled import ProfiledCostModel
from sim.profiled_regimes import regime_of
from sim.profiled_validation import priced_measurement

SIM = ["backend=sim", "backend.cost_model=profiled"]
KEEP = ("model=", "hardware=", "workload", "scheduler.", "cache.")  # what the simulated run takes from the case
GRID_S = 0.0005  # the time grid the decode states are sampled on
Block = tuple[int, int]  # (request id, index): the request that first made the block, and where


def case_overrides(pack: Path, case: str) -> list[str]:
    plan = json.loads((pack / "plan.json").read_text())
    for entry in plan:
        if Path(entry["out"]).name == case:
            return [o for o in entry["overrides"] if o.startswith(KEEP)]
    raise SystemExit(f"error: no case {case!r} in {pack / 'plan.json'}; cases: {[Path(e['out']).name for e in plan]}")


Simulated = tuple[pd.DataFrame, ProfiledCostModel, list[Request], int, GraphSizes]


def simulate(overrides: list[str], folder: Path) -> Simulated:
    """The simulated run's requests, its cost model, the requests themselves, the block size and
    the CUDA-graph sizes."""
    rc = compose_run_config([*SIM, *overrides])
    executor = BACKENDS.get("sim")(rc)
    info = executor.info()
    outcome = run_once(rc, progress=False, executor=executor)
    requests = build_workload(rc.workload, rc.scheduler.max_model_len, info.vocab_size).requests
    outcome.requests.to_csv(folder / "requests.csv", index=False)  # read back: the engine's columns and types
    served = pd.read_csv(folder / "requests.csv")
    return served, executor.cost_model, requests, rc.cache.block_size, info.graph_sizes


def physical_blocks(served: pd.DataFrame, requests: list[Request], block_size: int) -> dict[int, list[Block]]:
    """Each request's full prompt blocks as physical blocks: a block within its cached tokens is the
    block first made for that prefix (a hit is the block itself), any other one its own."""
    by_id = {int(r.request_id): r for r in requests}
    first: dict[bytes, Block] = {}
    blocks: dict[int, list[Block]] = {}
    for row in served.sort_values(["first_scheduled", "request_id"]).itertuples():
        request = by_id[int(row.request_id)]
        prompt = request.token_ids[: request.num_prompt_tokens]
        digests = chained_block_hashes(prompt, block_size)[: len(prompt) // block_size]
        own = [(int(row.request_id), k) for k in range(len(digests))]
        for k, digest in enumerate(digests):
            first.setdefault(digest, own[k])
        hits = int(row.cached_tokens) // block_size
        blocks[int(row.request_id)] = [first[d] for d in digests[:hits]] + own[hits:]
    return blocks


def prefill_groups(served: pd.DataFrame) -> pd.DataFrame:
    """One row per prefill step (the requests planned together): new and cached tokens, pairs,
    and its span where it ran right behind another prefill step (else NaN)."""
    served = served.assign(new=served.prompt_tokens - served.cached_tokens)
    served["pairs"] = attention_pairs(served.new.astype("int64"), served.cached_tokens.astype("int64"))
    # a step's requests were planned together and got their first tokens together
    groups = served.groupby(["first_scheduled", "first_token"]).agg(
        seqs=("request_id", "size"), new=("new", "sum"), cached=("cached_tokens", "sum"),
        pairs=("pairs", "sum")).reset_index().rename(columns={"first_token": "end"}).sort_values("end")
    before = groups["end"].shift(1)
    groups["span"] = np.where(groups.first_scheduled < before, groups["end"] - before, np.nan)
    return groups


def prefill_features(group: Any, graphs: GraphSizes) -> dict[str, float]:
    padded = padded_size(graphs.prefill, group.new)
    return {"num_prefill_tokens": group.new, "num_decode_tokens": 0, "num_tokens": group.new, "num_seqs": group.seqs,
            "num_sampled": group.seqs, "num_seeded": group.seqs, "prefill_context_tokens": group.cached,
            "prefill_attention_pairs": group.pairs, "decode_context_tokens": 0, "decode_repeated_tokens": 0,
            "prefill_repeated_tokens": 0, "cuda_graph": int(padded is not None),
            "graph_batch_size": group.seqs if padded is None else padded}


def decode_states(served: pd.DataFrame, blocks: dict[int, list[Block]], block_size: int, graphs: GraphSizes,
                  model: ProfiledCostModel) -> pd.DataFrame:
    """The running set's decode state and its price every GRID_S seconds."""
    first, finish = served.first_token.to_numpy(), served.finish.to_numpy()
    prompt, steps = served.prompt_tokens.to_numpy(), served.output_tokens.to_numpy() - 1
    ids = served.request_id.to_numpy()
    rows = []
    for t in np.arange(0.0, finish.max(), GRID_S):
        running = np.flatnonzero((first <= t) & (finish > t))
        if not len(running):
            continue
        done = np.floor((t - first[running]) / np.maximum(finish[running] - first[running], 1e-9) * steps[running])
        read = [b for j in running for b in blocks[int(ids[j])]]
        n = len(running)
        features = {"num_prefill_tokens": 0, "num_decode_tokens": n, "num_tokens": n, "num_seqs": n, "num_sampled": n,
                    "num_seeded": n, "prefill_context_tokens": 0, "prefill_attention_pairs": 0,
                    "decode_context_tokens": float((prompt[running] + 1 + done).sum()),
                    "decode_repeated_tokens": (len(read) - len(set(read))) * block_size,
                    "prefill_repeated_tokens": 0, "cuda_graph": 1,
                    "graph_batch_size": padded_size(graphs.decode, n) or n}
        rows.append((t, n, features["decode_context_tokens"], features["decode_repeated_tokens"],
                     model.predict_features(features) + model.host_time(features)))
    return pd.DataFrame(rows, columns=["t", "seqs", "context", "repeated", "priced_s"])


def reconstructed(served: pd.DataFrame, requests: list[Request], block_size: int, graphs: GraphSizes,
                  model: ProfiledCostModel) -> dict[str, float]:
    """Median (priced - measured) / measured of the reconstructed prefill and decode steps."""
    groups = prefill_groups(served)
    groups["priced"] = [model.predict_features(prefill_features(g, graphs)) for g in groups.itertuples()]
    spans = groups.dropna(subset=["span"])
    states = decode_states(served, physical_blocks(served, requests, block_size), block_size, graphs, model)
    start = groups["end"] - groups["span"].fillna(groups["priced"])
    errors = []
    for row in served[served.output_tokens >= 10].itertuples():
        if ((start < row.finish) & (groups["end"] > row.first_token)).any():
            continue  # a prefill step ran during its decode
        life = states[(states.t >= row.first_token) & (states.t < row.finish)]
        errors.append(life.priced_s.mean() / row.tpot - 1)
    long = spans[[padded_size(graphs.prefill, new) is None for new in spans.new]]  # eager prefill steps
    return {"prefill_steps": len(long), "prefill_err_median": float((long.priced / long.span - 1).median()),
            "decode_lives": len(errors), "decode_err_median": float(np.median(errors)) if errors else float("nan"),
            "mean_seqs": float(states.seqs.mean()),
            "mean_context_per_seq": float((states.context / states.seqs).mean())}


def by_regime(model: ProfiledCostModel, steps: pd.DataFrame) -> pd.DataFrame:
    """Every recorded engine step priced by the model, summed by regime."""
    table = steps.rename(columns={"duration": "duration_s"})
    table["regime"] = [regime_of(row) for row in table.to_dict("records")]
    table["measured"] = priced_measurement(table)
    table["priced"] = model.predict(table)
    return table.groupby("regime").apply(lambda g: pd.Series({
        "steps": len(g), "measured_s": g.measured.sum(), "priced_s": g.priced.sum(),
        "sum_err": g.priced.sum() / g.measured.sum() - 1, "median_err": (g.priced / g.measured - 1).median()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack", type=Path, help="bench_serve's harness.tar.gz or its folder")
    parser.add_argument("--case", required=True, help="a case of the pack, as azure_50 or mooncake_80")
    parser.add_argument("--profile", default=None, help="a profiled model's CSV (default: the hardware's shipped one)")
    parser.add_argument("--trace-dir", default=None, help="folder of the trace files (default: the case's)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="simulator settings to price with (backend.* or hardware.*, "
                             "as backend.repeated_reads=overlap)")
    args = parser.parse_args(argv)
    bad = [o for o in args.set if not o.startswith(("backend.", "hardware.")) or "=" not in o]
    if bad:
        parser.error(f"--set: {bad}: give backend.<field>=<value> or hardware.<field>=<value> settings "
                     "of the simulator")
    if not args.pack.exists():
        parser.error(f"no such pack: {args.pack}")
    warnings.simplefilter("ignore")  # extrapolation warnings: the steps are what they are
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pack = args.pack
        if pack.is_file():
            with tarfile.open(pack) as tar:
                tar.extractall(folder / "pack", filter="data")
            pack = folder / "pack" / "harness"
        overrides = case_overrides(pack, args.case)
        overrides = [o for o in overrides if not (args.trace_dir and o.startswith("workload.trace_dir="))]
        overrides += [f"workload.trace_dir={Path(args.trace_dir).resolve()}"] if args.trace_dir else []
        overrides += [f"backend.profile_path={Path(args.profile).resolve()}"] if args.profile else []
        overrides += args.set
        engine = pd.read_csv(pack / args.case / "requests.csv")
        sim, model, requests, block_size, graphs = simulate(overrides, folder)
        pair = engine.merge(sim, on="request_id", suffixes=("_engine", "_sim"))
        same = int((pair.cached_tokens_engine == pair.cached_tokens_sim).sum())
        print(f"{args.case}: cached tokens equal for {same} of {len(pair)} requests; prefix hit rate "
              f"engine {engine.cached_tokens.sum() / engine.prompt_tokens.sum():.4f}, "
              f"simulator {sim.cached_tokens.sum() / sim.prompt_tokens.sum():.4f}")
        rows = {source: reconstructed(served, requests, block_size, graphs, model)
                for source, served in (("engine", engine), ("simulator (check)", sim))}
        print(pd.DataFrame(rows).T.round(4).to_string())
        if (pack / args.case / "steps.csv.gz").is_file():
            print(by_regime(model, pd.read_csv(pack / args.case / "steps.csv.gz")).round(4).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
