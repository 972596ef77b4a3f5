"""Executors that wrap a loaded engine so several runs can share it (through the seam only)."""

from __future__ import annotations

import dataclasses

from engine.core import BackendInfo, GraphSizes


class KeepAlive:
    """An executor whose shutdown() does nothing: several runs share one loaded engine."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def info(self) -> BackendInfo:
        return self.inner.info()

    def execute(self, plan):
        return self.inner.execute(plan)

    def submit(self, plan):
        return self.inner.submit(plan)

    def observe(self, hook):
        return self.inner.observe(hook)

    def hold_device(self, seconds: float) -> bool:
        return self.inner.hold_device(seconds)

    def shutdown(self) -> None:
        pass


class EagerSteps(KeepAlive):
    """A shared engine that runs every step eagerly (no CUDA graph) and says so in info(), so a
    comparison prices those steps as eager too."""

    def info(self) -> BackendInfo:
        return dataclasses.replace(self.inner.info(), graph_sizes=GraphSizes())

    def execute(self, plan):
        return self.inner.execute(dataclasses.replace(plan, use_cuda_graphs=False))

    def submit(self, plan):
        return self.inner.submit(dataclasses.replace(plan, use_cuda_graphs=False))
