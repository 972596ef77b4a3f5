"""Cost models price a step: the CostModel protocol and the factory that picks one from SimConfig.

- RooflineCostModel (sim/roofline.py): from the model's shape and the hardware's peaks; needs no
  measurement, so it is the uncalibrated prediction.
- ProfiledCostModel (sim/profiled.py): fitted to the engine's measured step times;
- TPTransferCostModel (sim/tp_transfer.py): a TP=1 profile priced at a larger tp_size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.core.graph_sizes import GraphSizes
from engine.core.plan import StepPlan
from sim.config import SimConfig
from sim.profiled import ProfiledCostModel
from sim.repeated_reads import with_prior
from sim.roofline import RooflineCostModel
from sim.specs import HardwareSpec, ModelSpec
from sim.tp_transfer import TPTransferCostModel


class CostModel(Protocol):
    def step_time(self, plan: StepPlan) -> float:
        """Seconds the step takes."""

    def drained(self) -> None:
        """No step is in flight: the next step is launched onto an idle device (the first step of a
        run, after the queue ran dry, or when every runnable request waited on the step before), so
        nothing hides its launches."""


def make_cost_model(model: ModelSpec, hardware: HardwareSpec, sim: SimConfig,
                    graphs: GraphSizes | Sequence[int] = ()) -> CostModel:
    if sim.cost_model == "roofline":
        return RooflineCostModel(model, hardware, sim.execution.tensor_parallel_size, sim.execution.all_reduce)
    # NOTE: a profile is specific to the model, hardware, KV-cache dtype and tp_size it was
    # measured with; those arguments only choose the CSV, through the config that named it, except
    # that a TP=1 profile (sim.profile_tp_size=1) is carried to a larger tp_size by the TP transfer.
    # repeated KV reads: the fit's price, or the hardware's L2 prior where the profile had none
    profiled = with_prior(ProfiledCostModel.load(sim.profile_path, graphs), hardware)
    if sim.transfers_tp:
        return TPTransferCostModel(profiled, model, hardware, sim.execution.tensor_parallel_size,
                                   sim.execution.all_reduce)
    return profiled


__all__ = ["CostModel", "ProfiledCostModel", "RooflineCostModel", "TPTransferCostModel", "make_cost_model"]
