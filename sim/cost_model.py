"""Cost models price a step: the CostModel protocol, the registry of cost models by name
(backend.cost_model) and the factory that builds the one SimConfig names.

- RooflineCostModel (sim/roofline.py): from the model's shape and the hardware's peaks; needs no
  measurement, so it is the uncalibrated prediction.
- ProfiledCostModel (sim/profiled.py): fitted to the engine's measured step times;
- TPTransferCostModel (sim/tp_transfer.py): a TP=1 profile priced at a larger tp_size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan
from engine.core.registry import Registry
from sim.decode_programs import DecodePrograms
from sim.device_speed import with_device_scale
from sim.features import MOE_FEATURES
from sim.host_speed import with_host_jitter, with_host_scale
from sim.launch_line import load_launch_line, with_launch_line
from sim.moe import WeightReadFloor
from sim.moe_locality import SequenceRouting
from sim.prefill_programs import PrefillPrograms
from sim.profiled import ProfiledCostModel
from sim.repeated_reads import with_prior
from sim.roofline import RooflineCostModel
from sim.specs import HardwareSpec, ModelSpec
from sim.tp_transfer import TPTransferCostModel
from sim.transfer import transfer

if TYPE_CHECKING:  # sim.config validates cost_model names through this module's registry
    from sim.config import SimConfig


class CostModel(Protocol):
    def step_time(self, plan: StepPlan) -> float:
        """Seconds the step takes."""

    def drained(self) -> None:
        """No step is in flight: the next step is launched onto an idle device (the first step of a
        run, after the queue ran dry, or when every runnable request waited on the step before), so
        nothing hides its launches."""


Graphs = GraphSizes | Sequence[int]
CostModelBuilder = Callable[[ModelSpec, HardwareSpec, "SimConfig", Graphs], CostModel]

# NOTE: registration order is the order compare and fidelity report cost models in by default.
COST_MODELS: Registry[CostModelBuilder] = Registry("backend.cost_model")


@COST_MODELS.register("profiled")
def _profiled(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, graphs: Graphs) -> CostModel:
    # NOTE: a profile is specific to the model, hardware, KV-cache dtype and tp_size it was
    # measured with; those arguments only choose the CSV, through the config that named it, except
    # that a TP=1 profile (sim.profile_tp_size=1) is carried to a larger tp_size by the TP transfer.
    # repeated KV reads: the fit's price, or the hardware's L2 prior where the profile had none
    assert sim.profile_path is not None  # SimConfig requires it for this cost model
    programs = prefill_programs(model, hardware, sim)
    kernel = decode_kernel(model, hardware, sim)
    if sim.decode_merge and kernel is None:
        raise ValueError(f"backend.decode_merge=true needs hardware.num_sms and hardware.decode_program_bandwidth; "
                         f"{hardware.name} lacks them")
    profiled = ProfiledCostModel.load(sim.profile_path, graphs, programs, fit_programs=sim.prefill_programs,
                                      decode_merge=kernel if sim.decode_merge else None)
    if profiled.prices_merge:  # fitted with the merge: priced with this GPU's kernel
        if kernel is None:
            raise ValueError(f"backend.profile_path {sim.profile_path} prices the decode kernel's merge "
                             f"(sim/decode_merge.py); {hardware.name} lacks num_sms / decode_program_bandwidth")
        profiled.merge_programs = kernel
    if sim.profile_hardware is not None and sim.profile_hardware.name != hardware.name:
        profiled = transfer(profiled, sim.profile_hardware, hardware, model, sim.profile_tp_size or 1)
    profiled = with_prior(profiled, hardware, sim.repeated_reads)
    if sim.launch_line_grid is not None:  # decode graph launches by a robust line (sim.launch_line)
        profiled = with_launch_line(profiled, load_launch_line(sim.launch_line_grid))
    # the serving loop's own work between submits, at the profile's host (scaled with the launches)
    profiled.loop_s, profiled.loop_per_seq_s = sim.loop_s, sim.loop_per_seq_s
    if sim.host_scale != 1.0:  # another host CPU than the profile's (sim.host_speed)
        profiled = with_host_scale(profiled, sim.host_scale)
    if sim.host_jitter:
        profiled = with_host_jitter(profiled, sim.host_jitter, sim.execution.seed)
    if sim.device_scale != 1.0:  # another GPU of the profile's kind (sim.device_speed)
        profiled = with_device_scale(profiled, sim.device_scale)
    if model.is_moe:
        profiled.distinct_experts = SequenceRouting(model.num_experts, model.num_experts_per_tok,
                                                    sim.moe_routing_skew, sim.moe_routing_locality,
                                                    sim.moe_routing_shared_fresh, sim.moe_routing_shared_cap).distinct
        profiled.shared_prefix_routing = sim.moe_routing_shared_prefix
        # a TP=1 profile carried to a larger tp_size is priced at TP=1, then transferred
        profiled.floor = WeightReadFloor(model, hardware, 1 if sim.transfers_tp else sim.execution.tensor_parallel_size)
    elif profiled.uses_moe_features:
        raise ValueError(f"backend.profile_path {sim.profile_path} was measured on a mixture-of-experts model "
                         f"(it has {list(MOE_FEATURES)}); {model.name} is dense")
    profiled.decode_programs = decode_programs(model, hardware, sim)
    # the term's programs are the serving GPU's, also for a profile carried from another
    profiled.prefill_programs = programs if profiled.uses_prefill_programs else None
    if sim.transfers_tp:
        return TPTransferCostModel(profiled, model, hardware, sim.execution.tensor_parallel_size,
                                   sim.execution.all_reduce, sim.moe_routing_skew, sim.execution.expert_parallel)
    return profiled


def prefill_programs(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig) -> PrefillPrograms | None:
    """The engine's prefill kernel on this GPU (sim.prefill_programs), or None where the hardware
    lacks its figures (then backend.prefill_programs and a profile fitted with the term are refused).
    A TP=1 profile carried to a larger tp_size is priced at TP=1, then transferred."""
    tp = 1 if sim.transfers_tp else sim.execution.tensor_parallel_size
    programs = PrefillPrograms.of(model, hardware, tp, cached_kv=sim.prefill_cached_kv)
    if programs is None and sim.prefill_programs:
        raise ValueError(f"backend.prefill_programs=true needs hardware.num_sms and hardware.prefill_programs_per_sm; "
                         f"{hardware.name} lacks them")
    return programs


def decode_kernel(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig) -> DecodePrograms | None:
    """The engine's decode kernel on this GPU (its programs, without waves), or None where the
    hardware lacks its figures. A TP=1 profile carried to a larger tp_size is priced at TP=1."""
    if hardware.num_sms is None or hardware.decode_program_bandwidth is None:
        return None
    tp = 1 if sim.transfers_tp else sim.execution.tensor_parallel_size
    key_bytes = model.kv_bytes_per_token_per_rank(tp) // (model.num_layers * model.kv_heads_per_rank(tp))
    return DecodePrograms(model.kv_heads_per_rank(tp), model.num_layers, key_bytes, hardware.num_sms,
                          hardware.decode_program_bandwidth)


def decode_programs(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig) -> DecodePrograms | None:
    """The engine's decode kernel on this GPU (sim.decode_programs), or None where sim.decode_programs
    is off or the hardware lacks its figures. A TP=1 profile carried to a larger tp_size is priced at
    TP=1, then transferred."""
    kernel = decode_kernel(model, hardware, sim)
    if not sim.decode_programs or kernel is None:
        return None
    if sim.decode_programs_baseline == "grid_waves" and hardware.decode_programs_per_sm is None:
        raise ValueError("backend.decode_programs_baseline=grid_waves takes the grid's waves off the decode "
                         f"kernel's wait: {hardware.name} prices no waves (set hardware.decode_programs_per_sm)")
    return replace(kernel, resident_per_sm=hardware.decode_programs_per_sm, baseline=sim.decode_programs_baseline)


@COST_MODELS.register("roofline")
def _roofline(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, graphs: Graphs) -> CostModel:
    return RooflineCostModel(model, hardware, sim.execution.tensor_parallel_size, sim.execution.all_reduce,
                             sim.moe_routing_skew, sim.execution.expert_parallel)


def make_cost_model(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig, graphs: Graphs = ()) -> CostModel:
    """The cost model sim.cost_model names, built for this model and hardware."""
    return COST_MODELS.get(sim.cost_model)(model, hardware, sim, graphs)


__all__ = ["COST_MODELS", "CostModel", "ProfiledCostModel", "RooflineCostModel", "TPTransferCostModel",
           "make_cost_model"]
