"""The simulator backend: the scheduler core's Executor seam, with steps priced by a cost model."""

from __future__ import annotations

from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.plan import KVCacheSpec
from sim.config import SimConfig
from sim.cost_model import CostModel, make_cost_model
from sim.executor import SimExecutor
from sim.features import FEATURE_COLUMNS, GraphSizes, cuda_graph_batch_sizes, step_features
from sim.memory import estimate_activation_bytes, plan_num_blocks
from sim.profiled import ExtrapolationWarning, ProfiledCostModel, holdout_validation, relative_errors
from sim.roofline import RooflineCostModel
from sim.specs import HardwareSpec, ModelSpec


def build_sim_executor(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, cache: CacheConfig,
                       scheduler: SchedulerConfig) -> SimExecutor:
    """A SimExecutor for this configuration; its block count is cache.num_blocks if set, else planned."""
    num_blocks = cache.num_blocks
    if num_blocks is None:
        num_blocks = plan_num_blocks(model, hardware, cache.block_size, sim.gpu_memory_utilization,
                                     sim.activation_reserve_bytes, sim.tp_size, scheduler.max_num_batched_tokens,
                                     scheduler.max_num_seqs)
    cost_model = make_cost_model(model, hardware, sim,
                                 sim.graph_sizes(scheduler.max_num_seqs, scheduler.max_num_batched_tokens))
    vocab_size = model.vocab_size if sim.vocab_size is None else sim.vocab_size
    return SimExecutor(cost_model, KVCacheSpec(num_blocks, cache.block_size), vocab_size, sim.seed, sim.eos_token_id,
                       sim.async_scheduling)


__all__ = [
    "FEATURE_COLUMNS", "CostModel", "ExtrapolationWarning", "GraphSizes", "HardwareSpec", "ModelSpec", "ProfiledCostModel",
    "RooflineCostModel", "SimConfig", "SimExecutor", "build_sim_executor", "cuda_graph_batch_sizes",
    "estimate_activation_bytes", "holdout_validation", "plan_num_blocks", "relative_errors", "step_features",
]
