"""The simulator backend: the scheduler core's Executor seam, with steps priced by a cost model."""

from __future__ import annotations

from engine.core.collectives import priced_all_reduce
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.executor import BackendInfo
from engine.core.expert_parallel import check_expert_parallel
from engine.core.graph_sizes import GraphSizes, planned_graph_sizes
from sim.config import SimConfig
from sim.cost_model import CostModel, make_cost_model
from sim.executor import SimExecutor
from sim.features import FEATURE_COLUMNS, step_features
from sim.memory import estimate_activation_bytes, plan_num_blocks
from sim.power_limit import PowerCurve, read_power_curve
from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from sim.profiled_validation import holdout_validation, relative_errors
from sim.roofline import RooflineCostModel
from sim.sampled import SampledTokens
from sim.specs import HardwareSpec, ModelSpec
from sim.tp_transfer import TPTransferCostModel


def build_sim_executor(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, cache: CacheConfig,
                       scheduler: SchedulerConfig, cost_model: CostModel | None = None,
                       samples: SampledTokens | None = None, staging_blocks: int = 0) -> SimExecutor:
    """A SimExecutor for this configuration; its block count is cache.num_blocks if set, else planned.
    staging_blocks: a disaggregated replica's KV link staging (engine.core.kv_staging), kept out of
    the planned cache; a set cache.num_blocks is the cache itself, as the engine takes it.
    cost_model: prices steps instead of the one sim names (sim.interval's perturbed draws);
    samples: tokens computed ahead (sim.sampled), read by the executor where they cover its steps."""
    execution = sim.execution
    check_expert_parallel(model, execution.tensor_parallel_size, execution.expert_parallel)
    model = model.with_kv_cache(cache.kv_cache_dtype)
    num_blocks = cache.num_blocks
    if num_blocks is None:
        num_blocks = plan_num_blocks(model, hardware, cache.block_size, execution.gpu_memory_utilization,
                                     sim.activation_reserve_bytes, execution.tensor_parallel_size,
                                     scheduler.max_num_batched_tokens, scheduler.max_num_seqs, staging_blocks)
    graphs = configured_graph_sizes(sim, scheduler)
    if cost_model is None:
        cost_model = make_cost_model(model, hardware, sim, graphs)
    info = BackendInfo(
        num_blocks=num_blocks,
        block_size=cache.block_size,
        vocab_size=model.vocab_size if sim.vocab_size is None else sim.vocab_size,
        eos_token_ids=() if sim.eos_token_id is None else (sim.eos_token_id,),
        overlaps_steps=execution.overlaps_steps(on_cuda=True),  # it simulates a CUDA device
        graph_sizes=graphs,
        device=f"simulated {hardware.name}",
        all_reduce=priced_all_reduce(execution.all_reduce, execution.tensor_parallel_size, hardware.prices_one_shot),
    )
    return SimExecutor(cost_model, info, execution.seed, sim.fast_forward, samples,
                       idle_start_s(hardware, sim, info.overlaps_steps, cost_model), sim.plan_after_launches,
                       kv_scatter(model, hardware, sim, execution.tensor_parallel_size),
                       power_curve(model, hardware, sim))


def configured_graph_sizes(sim: SimConfig, scheduler: SchedulerConfig) -> GraphSizes:
    """The CUDA graph sizes a simulated replica captures: the engine's plan for these settings."""
    return planned_graph_sizes(sim.execution, scheduler.max_num_seqs, scheduler.max_num_batched_tokens,
                               max_model_len=scheduler.max_model_len)


def configured_cost_model(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, cache: CacheConfig,
                          scheduler: SchedulerConfig) -> CostModel:
    """A fresh cost model pricing steps as build_sim_executor's own would (its KV cache's dtype, its
    graphs): what sim.interval's perturbed draws wrap."""
    return make_cost_model(model.with_kv_cache(cache.kv_cache_dtype), hardware, sim,
                           configured_graph_sizes(sim, scheduler))


def power_curve(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig) -> PowerCurve | None:
    """The curve SimConfig.power_curve names (sim.power_limit), None without one; ValueError where
    it was measured for another model, or on a GPU of another die or power limit."""
    if sim.power_curve is None:
        return None
    curve = read_power_curve(sim.power_curve)
    if curve.model != model.name or not curve.prices(hardware):
        measured = f"{curve.chip or 'die not recorded'}, {curve.power_limit_w or '?'} W"
        serving = f"{hardware.chip or 'die unknown'}, {hardware.power_limit_w or '?'} W"
        raise ValueError(f"backend.power_curve {sim.power_curve} was measured for {curve.model} on {curve.hardware} "
                         f"({measured}); this run is {model.name} on {hardware.name} ({serving})")
    return curve


def kv_scatter(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, tp_size: int) -> tuple[float, float]:
    """(base seconds, seconds per token) of a landed request's write into a decode replica's cache
    (SimConfig.kv_scatter; each TP rank writes its own shard at once); ValueError where the
    hardware has no figures."""
    if not sim.kv_scatter:
        return 0.0, 0.0
    if hardware.kv_scatter_base_s is None or hardware.kv_scatter_bandwidth is None:
        raise ValueError(f"backend.kv_scatter=true: hardware {hardware.name} has no kv_scatter_base_s and "
                         "kv_scatter_bandwidth (h200.yaml says how they were measured); set backend.kv_scatter=false")
    return hardware.kv_scatter_base_s, model.kv_bytes_per_token_per_rank(tp_size) / hardware.kv_scatter_bandwidth


def idle_start_s(hardware: HardwareSpec, sim: SimConfig, overlaps_steps: bool, cost_model: CostModel) -> float:
    """What a step submitted onto an idle device waits before its device work (SimConfig.idle_start);
    ValueError where it cannot be priced, or where the profile's lead fits price it already (a lead
    is timed from submit(), so it holds the device clock's anchor and the batch's building).
    idle_start None: the hardware's figure where true would take it beside a profile, else 0."""
    if sim.idle_start is None:
        leads = getattr(cost_model, "prices_lead", True)
        priced = sim.cost_model == "profiled" and not leads and overlaps_steps
        return hardware.idle_start_host_s if priced and hardware.idle_start_host_s is not None else 0.0
    if not sim.idle_start:
        return 0.0
    if getattr(cost_model, "prices_lead", False):  # the profiled model, or a wrapper's (tp_transfer, interval)
        raise ValueError("backend.idle_start=true: the profile's lead fits (lead:<regime>) already price an idle "
                         "start's host work from submit(); use a profile without them or backend.idle_start=false")
    if hardware.idle_start_host_s is None:
        raise ValueError(f"backend.idle_start=true: hardware {hardware.name} has no idle_start_host_s "
                         "(measure it: experiments/disagg/prefill_probe.py); set backend.idle_start=false")
    if not overlaps_steps:
        raise ValueError("backend.idle_start=true prices overlapped steps' idle starts: it needs "
                         "execution.async_scheduling (steps run one at a time are priced by the host fit)")
    return hardware.idle_start_host_s


__all__ = [
    "FEATURE_COLUMNS", "CostModel", "ExtrapolationWarning", "HardwareSpec", "ModelSpec", "ProfiledCostModel",
    "RooflineCostModel", "SampledTokens", "SimConfig", "SimExecutor", "TPTransferCostModel", "build_sim_executor",
    "configured_cost_model", "estimate_activation_bytes", "holdout_validation", "plan_num_blocks", "relative_errors",
    "step_features",
]
