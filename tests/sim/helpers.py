"""Shared builders for simulator tests: specs of named models and conf/hardware, and step plans from
(new, cached) counts."""

from __future__ import annotations

from pathlib import Path

import yaml

from engine.core.executor import BackendInfo, CompletedStep
from engine.core.graph_sizes import GraphSizes
from engine.core.model_shapes import model_shape
from engine.core.plan import ScheduledRequest, StepPlan, StepResult, StepStats
from engine.core.sampling_params import SamplingParams
from sim.features import step_features
from sim.specs import HardwareSpec, ModelSpec

CONF = Path(__file__).resolve().parents[2] / "conf"
_PARAMS = SamplingParams()


def model(name: str) -> ModelSpec:
    return ModelSpec.from_shape(model_shape(name))


def hardware(name: str) -> HardwareSpec:
    return HardwareSpec(**yaml.safe_load((CONF / "hardware" / f"{name}.yaml").read_text()))


def prefill(num_new: int, num_cached: int = 0, sample: bool = True, rid: str = "p") -> ScheduledRequest:
    return ScheduledRequest(rid, [1] * num_new, num_cached, [], sample, _PARAMS, 0, False)


def decode(context_before: int, rid: str = "d") -> ScheduledRequest:
    """A decode of one token after context_before tokens already in the cache."""
    return ScheduledRequest(rid, [1], context_before, [], True, _PARAMS, 1, True)


def plan(*entries: ScheduledRequest) -> StepPlan:
    prefill_tokens = sum(len(e.token_ids) for e in entries if not e.is_decode)
    decodes = sum(1 for e in entries if e.is_decode)
    stats = StepStats(0, "mixed", len(entries), prefill_tokens, decodes, 0, 0, 0, 0, 0)
    return StepPlan(list(entries), stats)


def decode_batch(contexts: list[int]) -> StepPlan:
    return plan(*(decode(c, rid=f"d{i}") for i, c in enumerate(contexts)))


class LawExecutor:
    """A fake device for profiling tests: prices each step by true_cost(features) of its
    sim.features row; a plan with use_cuda_graphs off runs eagerly."""

    def __init__(self, true_cost, graphs: GraphSizes, num_blocks: int = 20000, block_size: int = 16) -> None:
        self._true_cost = true_cost
        self._graphs = graphs
        self._info = BackendInfo(num_blocks, block_size, 1000, graph_sizes=graphs)

    def info(self) -> BackendInfo:
        return self._info

    def execute(self, step_plan) -> StepResult:
        graphs = self._graphs if step_plan.use_cuda_graphs else ()
        return StepResult([0] * len(step_plan.scheduled), self._true_cost(step_features(step_plan, graphs)))

    def submit(self, step_plan):
        return CompletedStep(self.execute(step_plan))

    def observe(self, hook) -> None:
        raise NotImplementedError("the profiler needs no hooks")

    def hold_device(self, seconds: float) -> bool:
        return False

    def shutdown(self) -> None:
        pass
