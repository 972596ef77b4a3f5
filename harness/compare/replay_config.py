"""The settings under which the simulator replays an engine run of a comparison: the CUDA graphs the
engine captured, its overlap, TP size and all-reduce (read from its saved metadata), and the run
config and cost model of each simulated side (harness.compare.study)."""

from __future__ import annotations

import dataclasses

from engine.core import ExecutionConfig, GraphSizes
from harness.config import RunConfig


def engine_graph_sizes(meta: dict) -> GraphSizes:
    """The CUDA graphs a saved engine run replayed (runs saved before prefill graphs had none, and
    before their capture context was saved, an unknown one)."""
    return GraphSizes(tuple(meta["graph_batch_sizes"]), tuple(meta.get("prefill_graph_sizes", ())),
                      int(meta.get("decode_graph_context", 0)))


def describe(graphs: GraphSizes) -> str:
    if not graphs:
        return "none (eager)"
    decode = f"decode up to {graphs.decode[-1]} sequences" if graphs.decode else "no decode"
    return decode + (f", prefill up to {graphs.prefill[-1]} tokens" if graphs.prefill else ", prefill eager")


def engine_execution(meta: dict) -> ExecutionConfig:
    """The execution settings under which the simulator replays a saved engine run: the graphs
    the engine captured (engine.core.graph_sizes maps them back to the settings exactly), its
    overlap (runs saved before async scheduling ran their steps one at a time), its TP size and
    its all-reduce as it was set up ("auto" resolved; runs saved before that setting existed ran
    NCCL's)."""
    graphs = engine_graph_sizes(meta)
    engine_config = meta.get("engine_config") or {}
    execution = engine_config.get("execution") or engine_config
    return ExecutionConfig(enforce_eager=not graphs, async_scheduling=bool(meta.get("async_scheduling", False)),
                           prefill_graph_tokens=max(graphs.prefill, default=0),
                           max_graph_batch_size=max(graphs.decode, default=ExecutionConfig.max_graph_batch_size),
                           tensor_parallel_size=execution.get("tensor_parallel_size", 1),
                           all_reduce=meta.get("all_reduce") or execution.get("all_reduce", "nccl"))


def sim_run_config(rc: RunConfig, cost_model: str, profile_path: str | None, meta: dict) -> RunConfig:
    from sim.config import SimConfig

    # an MoE model's routing (skew, locality, shared prefixes), where the engine side measured it
    # (harness.fidelity.routing); a profiled side's idle start as the held-out protocol sets it
    # (fidelity.idle_start; none in a saved run's meta)
    sim = SimConfig(cost_model=cost_model, profile_path=profile_path if cost_model == "profiled" else None,
                    execution=engine_execution(meta), moe_routing_skew=float(meta.get("moe_routing_skew", 0.0)),
                    moe_routing_locality=float(meta.get("moe_routing_locality", 0.0)),
                    moe_routing_shared_prefix=bool(meta.get("moe_routing_shared_prefix", False)),
                    moe_routing_shared_fresh=meta.get("moe_routing_shared_fresh"),
                    moe_routing_shared_cap=meta.get("moe_routing_shared_cap"),
                    idle_start=meta.get("idle_start", False) if cost_model == "profiled" else False)
    cache = dataclasses.replace(rc.cache, num_blocks=int(meta["num_blocks"]))
    return dataclasses.replace(rc, backend="sim", sim=sim, engine=None, cache=cache)


def step_pricer(sim_rc: RunConfig, meta: dict):
    """The cost model a simulated run of sim_rc prices steps with, on the engine's CUDA graphs."""
    from sim.cost_model import make_cost_model

    return make_cost_model(sim_rc.model, sim_rc.hardware, sim_rc.sim, engine_graph_sizes(meta))
