"""Where a mixture-of-experts model's experts go in a planned deployment: each expert sliced over
the TP ranks, or whole experts per rank (execution.expert_parallel; docs/moe-pricing.md)."""

from __future__ import annotations

import dataclasses

from harness.config import RunConfig
from harness.plan.config import PlanConfig


def placements(plan: PlanConfig, rc: RunConfig, tp: int) -> tuple[bool | None, ...]:
    """The expert placements searched at TP size tp: plan.expert_parallel for a mixture-of-experts
    model above TP 1, sliced experts alone at TP 1, none (None) for a dense model."""
    if not rc.model.num_experts:
        return (None,)
    return tuple(dict.fromkeys(plan.expert_parallel)) if tp > 1 else (False,)


def with_expert_parallel(rc: RunConfig, expert_parallel: bool) -> RunConfig:
    """rc with its simulator's execution.expert_parallel set (the plan searches the simulator only)."""
    assert rc.sim is not None  # run_plan refuses any other backend
    if rc.sim.execution.expert_parallel == expert_parallel:
        return rc
    execution = dataclasses.replace(rc.sim.execution, expert_parallel=expert_parallel)
    return dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, execution=execution))

