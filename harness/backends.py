"""Backends by name (backend.name): how the harness builds the executor a run config asks for.

Each entry imports its backend when called, so a simulated run never loads torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from engine.core.registry import Registry

if TYPE_CHECKING:
    from engine.core import Executor
    from harness.config import RunConfig

BACKENDS: Registry[Callable[[RunConfig], Executor]] = Registry("backend.name")


@BACKENDS.register("sim")
def _sim(rc: RunConfig) -> Executor:
    from sim import build_sim_executor

    return build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler)


@BACKENDS.register("engine")
def _engine(rc: RunConfig) -> Executor:
    from engine.executor import EngineExecutor
    from harness.checkpoints import ensure_checkpoint

    ensure_checkpoint(rc.engine.model, rc.model)
    return EngineExecutor(rc.engine, rc.scheduler, rc.cache)
