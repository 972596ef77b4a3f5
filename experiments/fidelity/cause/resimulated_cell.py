"""What the cause scripts that simulate a held-out call's cells again share (priced_steps.py,
stalls.py): their command line (the call's heldout.csv, the profile it priced with, the model,
GPU, the engine's KV block count and the requests per cell), a cell's run configuration as
resimulate.py builds it with the profiled cost model, and one simulated run whose cost model the
script may wrap."""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

from engine.core.graph_sizes import planned_graph_sizes
from experiments.fidelity.resimulate import MAX_MODEL_LEN, cell_config
from harness.compare.study import sim_run_config
from harness.run import run_once
from harness.scripting import compose_run_config
from sim import build_sim_executor
from sim.cost_model import make_cost_model


def cell_parser(doc: str) -> argparse.ArgumentParser:
    """A parser, described by doc's first line, with the arguments every such script takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, required=True)
    return parser


def base_config(model: str, hardware: str):
    """The simulator's run configuration of the model on the GPU, at resimulate.py's max_model_len."""
    return compose_run_config([f"model={model}", f"hardware={hardware}", "backend=sim",
                               f"scheduler.max_model_len={MAX_MODEL_LEN}"])


def profiled_cell(base, workload: str, load: str, rate: float, num_requests: int, profile: Path, num_blocks: int):
    """The cell's run configuration, priced by the profile over the engine's num_blocks blocks."""
    rc = cell_config(base, workload, load, rate, num_requests, None)
    meta = {"num_blocks": num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}
    rc = sim_run_config(rc, "profiled", str(profile), meta)
    return dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, execution=base.sim.execution))


def simulate_cell(rc, wrap: Callable = lambda cost: cost):
    """The cell's simulated run summary, with the cost model wrap(rc's cost model)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens,
                                     max_model_len=rc.scheduler.max_model_len)
        cost = wrap(make_cost_model(rc.model, rc.hardware, rc.sim, graphs))
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
        return run_once(rc, False, executor=executor).summary
