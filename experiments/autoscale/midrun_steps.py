"""The engine's steps and the simulator's of a mid-run check side by side, each priced by the
simulator's cost model (CPU only).

A run folder of midrun_dp.py keeps each side's steps.csv.gz and requests.csv.gz (engine/ and sim/;
left out of the tree, ~2 MB a side). A step table says each step's kind, batch and new tokens, not
its contexts, so they are rebuilt from the request table: a request's prompt is a chunk of the
prefill step that ends at its first token, and it decodes in every decode step of its replica from
then until it finishes, its context one token longer each step (a step is matched by its
midpoint: the engine stamps a token when it reaches the host, a fraction of a step from its
end). Every step of both sides is then priced as the simulator prices a step of that shape (the
run's GPU profile, the decode kernel's programs, a prefill graph behind its predecessor). On the
simulator's own steps that gives back their durations (the log's check: it tests the rebuild);
on the engine's, the simulator's price of the very steps the engine ran, against what they took.

Writes under --out:
  midrun_steps.csv        per side, replica, window and kind of step: steps, mean batch (requests),
                          prefill tokens and decode context per step, busy seconds, mean measured and
                          priced step, of the price what the decode kernel's longest programs add
                          (sim.decode_programs), priced / measured - 1, and priced - measured summed
  midrun_step_shapes.csv  per side, replica and shape (a prefill step's padded graph size, a decode
                          step's batch in bins of 8), over the whole run: the same columns

  python -m experiments.autoscale.midrun_steps --run /path/to/midrun --out /tmp/steps
"""

from __future__ import annotations

import argparse
import sys
import warnings
from bisect import bisect_left
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from experiments.autoscale import midrun_dp
from experiments.autoscale.midrun_rerun import DEFAULTS

SIDES = ("engine", "sim")
DECODE_BIN = 8  # decode batches grouped 1-8, 9-16, ... in the shapes table


def cost_model(hardware: str, profile: Path | None = None, **settings):
    """The simulator's cost model and graph sizes for midrun_dp's fleet on this GPU (its shipped
    profile, or the given one)."""
    from engine.core.graph_sizes import planned_graph_sizes
    from sim.cost_model import make_cost_model

    args = SimpleNamespace(**{**DEFAULTS, **settings})
    chosen = [] if profile is None else [f"backend.profile_path={profile}"]
    rc = midrun_dp.compose(midrun_dp.fleet_overrides(args, hardware) + ["backend=sim", "backend.cost_model=profiled",
                                                                        *chosen])[0]
    graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens,
                                 max_model_len=rc.scheduler.max_model_len)
    return make_cost_model(rc.model, rc.hardware, rc.sim, graphs), graphs, rc.workload.temperature > 0


def _midpoints(steps: pd.DataFrame) -> np.ndarray:
    return (steps["start"] + steps["duration"] / 2).to_numpy()


def rebuild(steps: pd.DataFrame, requests: pd.DataFrame) -> tuple[list[list[tuple[int, int]]], list[list[int]]]:
    """One replica's steps (in start order): each prefill step's chunks (new tokens, cached tokens)
    and each decode step's sequence lengths (its own new token included); empty for the other kind."""
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(len(steps))]
    lens: list[list[int]] = [[] for _ in range(len(steps))]
    prefill = np.flatnonzero(steps["kind"].to_numpy() == "prefill")
    decode = np.flatnonzero(steps["kind"].to_numpy() == "decode")
    first, finish = requests["first_token"].to_numpy(), requests["finish"].to_numpy()
    prompt, cached = requests["prompt_tokens"].to_numpy(), requests["cached_tokens"].to_numpy()
    owner = np.searchsorted(_midpoints(steps.iloc[prefill]), first) - 1  # the prefill ending at the first token
    decode_mid = _midpoints(steps.iloc[decode])
    begin, end = np.searchsorted(decode_mid, first), np.searchsorted(decode_mid, finish)
    for i in range(len(requests)):
        if owner[i] >= 0:
            chunks[prefill[owner[i]]].append((int(prompt[i] - cached[i]), int(cached[i])))
        for j, k in enumerate(range(begin[i], end[i])):
            lens[decode[k]].append(int(prompt[i]) + 1 + j)
    return chunks, lens


def _features(kind: str, chunks: list[tuple[int, int]], lens: list[int], graphs, seeded: bool) -> dict[str, float]:
    """sim.features.step_features of a step rebuilt from its chunks or its decodes' lengths."""
    from engine.core.graph_sizes import padded_size
    from sim.features import attention_pairs

    new = sum(n for n, _ in chunks)
    seqs = len(chunks) + len(lens)
    graph, size = 0, seqs
    if kind == "decode" and graphs.decode and seqs <= graphs.decode[-1]:
        graph, size = 1, graphs.decode[bisect_left(graphs.decode, seqs)]
    elif kind == "prefill" and (padded := padded_size(graphs.prefill, new)) is not None:
        graph, size = 1, padded
    return {"num_prefill_tokens": new, "num_decode_tokens": len(lens), "num_tokens": new + len(lens),
            "num_seqs": seqs, "num_sampled": seqs, "num_seeded": seqs if seeded else 0,
            "prefill_context_tokens": sum(c for _, c in chunks),
            "prefill_attention_pairs": sum(attention_pairs(n, c) for n, c in chunks),
            "decode_context_tokens": sum(lens), "decode_repeated_tokens": 0, "prefill_repeated_tokens": 0,
            "cuda_graph": graph, "graph_batch_size": size}


def price(model, graphs, seeded: bool, steps: pd.DataFrame, chunks, lens) -> tuple[np.ndarray, ...]:
    """Each step's price as sim.profiled.ProfiledCostModel._price gives it, behind the step before
    it on its replica (none after an idle gap longer than the step before: nothing was in flight);
    each decode step's summed context and what the decode kernel's longest programs add to it. A
    profile fitted with the prefill kernel's programs prices them from each step's own chunks."""
    from sim.decode_programs import PROGRAM_EXCESS
    from sim.prefill_programs import PREFILL_PROGRAM_KEYS

    prices, contexts, excess = np.zeros(len(steps)), np.zeros(len(steps)), np.zeros(len(steps))
    starts, durations = steps["start"].to_numpy(), steps["duration"].to_numpy()
    programs, previous = model.decode_programs, None
    kernel = model.prefill_programs if model.uses_prefill_programs else None
    per_token = dict(zip(model.fits["decode_graph"].linear_features,
                         model.fits["decode_graph"].linear_coefs)).get("decode_context_tokens", 0.0)
    for i, kind in enumerate(steps["kind"].to_numpy()):
        features = _features(kind, chunks[i], lens[i], graphs, seeded)
        if kind == "decode" and programs is not None and programs.applies(len(lens[i])):
            # a graph launches with the split count it was captured with, as the simulator prices it
            graph = ((int(features["graph_batch_size"]), graphs.decode_context)
                     if features["cuda_graph"] and graphs.decode_context else None)
            features[PROGRAM_EXCESS] = excess[i] = programs.excess_s(lens[i], per_token, graph)
        if kind == "prefill" and kernel is not None:  # as the simulator's plan: its chunks, not their mean
            features[PREFILL_PROGRAM_KEYS] = kernel.excess_keys([n for n, _ in chunks[i]], [c for _, c in chunks[i]],
                                                                bool(features["cuda_graph"]))
        if i and starts[i] - (starts[i - 1] + durations[i - 1]) > durations[i - 1]:
            previous = None
        alone = model.predict_features(features)
        priced = model.overlapped(features, alone, previous) if model.prices_overlap else alone
        previous = (priced, model.overlap_parts(features)[0])
        prices[i], contexts[i] = priced + model.host_time(features), features["decode_context_tokens"]
    return prices, contexts, excess


def priced_side(folder: Path, model, graphs, seeded: bool) -> pd.DataFrame:
    """One side's steps, with each step's price and decode context, and how many steps' rebuilt
    batch or tokens differ from the step table's (the log says)."""
    steps = pd.read_csv(folder / "steps.csv.gz")
    requests = pd.read_csv(folder / "requests.csv.gz")
    parts = []
    for replica, mine in steps.groupby("replica", sort=True):
        mine = mine.sort_values("start", kind="stable").reset_index(drop=True)
        chunks, lens = rebuild(mine, requests[requests["replica"] == replica])
        rebuilt = np.array([len(c) + len(s) for c, s in zip(chunks, lens)])
        tokens = np.array([sum(n for n, _ in c) for c in chunks])
        off = (rebuilt != mine["requests"].to_numpy()) | (tokens != mine["prefill_tokens"].to_numpy())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # extrapolation warnings: the run's simulator saw them too
            prices, contexts, excess = price(model, graphs, seeded, mine, chunks, lens)
        parts.append(mine.assign(priced=prices, context=contexts, program_excess=excess, rebuilt_off=off))
    return pd.concat(parts, ignore_index=True)


def _summary(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    grouped = table.groupby(keys, sort=True)
    out = grouped.agg(steps=("duration", "size"), batch=("requests", "mean"), prefill_tokens=("prefill_tokens", "mean"),
                      context=("context", "mean"), busy_s=("duration", "sum"), priced_s=("priced", "sum"),
                      excess_s=("program_excess", "sum"))
    out["measured_ms"] = 1e3 * out["busy_s"] / out["steps"]
    out["priced_ms"] = 1e3 * out["priced_s"] / out["steps"]
    out["program_excess_ms"] = 1e3 * out["excess_s"] / out["steps"]
    out["priced_error"] = out["priced_s"] / out["busy_s"] - 1
    out["priced_minus_measured_s"] = out["priced_s"] - out["busy_s"]
    return out.drop(columns=["priced_s", "excess_s"]).reset_index()


def _shape(kind: str, tokens: int, batch: int, graphs) -> tuple[str, int]:
    """A step's shape (name, size to sort by): a prefill by the graph it pads to (eager past the
    largest), a decode by its batch in bins of DECODE_BIN."""
    from engine.core.graph_sizes import padded_size

    if kind == "prefill":
        padded = padded_size(graphs.prefill, int(tokens))
        return ("prefill eager", int(tokens)) if padded is None else (f"prefill graph {padded}", padded)
    top = DECODE_BIN * -(-int(batch) // DECODE_BIN)
    return f"decode {top - DECODE_BIN + 1}-{top}", top


def compare(run: Path, out: Path, hardware: str, window: float, profile: Path | None = None) -> pd.DataFrame:
    model, graphs, seeded = cost_model(hardware, profile)
    sides = []
    for side in SIDES:
        table = priced_side(run / side, model, graphs, seeded).assign(side=side)
        check = table["priced"] / table["duration"] - 1
        off = int(table["rebuilt_off"].sum())
        print(f"[steps] {side}: {len(table)} steps, rebuilt batch or tokens differ in {off}; "
              f"priced / measured - 1: median {check.median():+.4f}, max |.| {check.abs().max():.2e}", flush=True)
        sides.append(table)
    table = pd.concat(sides, ignore_index=True)
    table["start_s"] = np.floor(table["start"] / window) * window
    windows = _summary(table, ["side", "replica", "start_s", "kind"])
    windows.insert(3, "end_s", windows["start_s"] + window)
    table["shape"], table["size"] = zip(*(_shape(k, t, r, graphs) for k, t, r in
                                          zip(table["kind"], table["prefill_tokens"], table["requests"])))
    shapes = _summary(table, ["side", "replica", "kind", "size", "shape"])
    out.mkdir(parents=True, exist_ok=True)
    windows.to_csv(out / "midrun_steps.csv", index=False)
    shapes.to_csv(out / "midrun_step_shapes.csv", index=False)
    return windows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a midrun_dp output folder with engine/ and sim/ "
                   "steps.csv.gz and requests.csv.gz")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hardware", default="h200", help="the run's conf/hardware (its GPU profile prices the steps)")
    p.add_argument("--profile", type=Path, default=None, help="price with this profile instead of the GPU's shipped "
                   "one (the simulator's own steps then no longer match their prices)")
    p.add_argument("--window", type=float, default=DEFAULTS["window"], help="seconds per window (10)")
    args = p.parse_args(argv)
    for side in SIDES:
        for name in ("steps.csv.gz", "requests.csv.gz"):
            if not (args.run / side / name).is_file():
                raise SystemExit(f"error: --run {args.run} lacks {side}/{name} (midrun_dp keeps them beside its "
                                 "tables)")
    if not args.window > 0:
        raise SystemExit(f"error: --window must be > 0 seconds, got {args.window:g}")
    compare(args.run, args.out, args.hardware, args.window, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
