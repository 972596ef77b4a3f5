"""The replicas an autoscaled run scales, per backend: simulated ones on one event clock
(engine.core.elastic.run_elastic), or engine replica processes on the wall clock, started mid-run
as the policy asks (engine.core.elastic_wall.run_elastic_wall over engine.replicas)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from engine.core import make_scheduler
from engine.core.elastic import ElasticResult, ReplicaLimits, Scaling, ScalingPolicy, run_elastic
from engine.core.executor import BackendInfo
from engine.core.loop import FleetStepHook, Replica, SimulatedClock, WallClock
from engine.core.request import Request
from engine.core.routers import Router
from harness.autoscale.capacity import replica_limits
from harness.autoscale.config import AutoscaleConfig
from harness.config import RunConfig
from harness.convert import ConfigError
from harness.fleet.intake import fleet_intake
from harness.run import cyclic_gc_paused

Serve = Callable[[Sequence[Request], Router, Scaling, "ScalingPolicy | None", "FleetStepHook | None"], ElasticResult]


@dataclass
class ElasticFleet:
    info: BackendInfo  # the first replica's (the workload is built for it)
    serve: Serve  # runs a workload to completion on initial replicas that the policy scales
    blocks: Callable[[int], list[int]]  # each of the run's n replicas' KV blocks
    limits: ReplicaLimits | None = None  # a replica's resources, for the policies' sizing (simulated replicas)


def processes_needed(initial: int, autoscale: AutoscaleConfig) -> int:
    """How many replica processes an engine fleet may start: the initial ones and every one the
    schedule adds (a replica drained or cancelled keeps its GPUs until the run ends, so a later
    scale-up starts a new process on the next GPUs)."""
    total = current = initial
    for _, count in autoscale.schedule or ():
        total += max(0, int(count) - current)
        current = int(count)
    return total


@contextmanager
def elastic_fleet(rc: RunConfig, one: RunConfig, initial: int, autoscale: AutoscaleConfig) -> Iterator[ElasticFleet]:
    """one: a replica's RunConfig (its TP size set); the fleet starts with `initial` replicas ready."""
    built = _engine(rc, one, initial, autoscale) if rc.backend == "engine" else _sim(one, initial)
    try:
        fleet = next(built)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"backend={rc.backend}: {error}") from None
    try:
        yield fleet
    finally:
        built.close()


def _sim(one: RunConfig, initial: int) -> Iterator[ElasticFleet]:
    from sim import build_sim_executor

    probe = build_sim_executor(one.model, one.hardware, one.sim, one.cache, one.scheduler)
    info = probe.info()
    intake = fleet_intake(one)  # the engine's elastic fleet: replica processes, even one

    def make_replica(index: int) -> Replica:
        executor = probe if index == 0 else build_sim_executor(one.model, one.hardware, one.sim, one.cache,
                                                               one.scheduler)
        replica = Replica(index, make_scheduler(one.scheduler, info, one.cache), executor, SimulatedClock())
        replica.intake = intake
        return replica

    def serve(requests, router, scaling, policy, on_step) -> ElasticResult:
        with cyclic_gc_paused():
            return run_elastic(make_replica, initial, requests, router, scaling, policy, on_step)

    pricing = build_sim_executor(one.model, one.hardware, one.sim, one.cache, one.scheduler).cost_model
    limits = replica_limits(pricing.step_time, one.scheduler, info.num_blocks, info.block_size)
    yield ElasticFleet(info, serve, lambda n: [info.num_blocks] * n, limits)


def _engine(rc: RunConfig, one: RunConfig, initial: int, autoscale: AutoscaleConfig) -> Iterator[ElasticFleet]:
    """Replica processes (each on its own GPUs) for every start the schedule makes: `initial` load
    before the run, the others when the policy starts them."""
    from engine.core.elastic_wall import run_elastic_wall
    from engine.replicas import EngineReplicas
    from harness.checkpoints import ensure_checkpoint

    ensure_checkpoint(rc.engine.model, rc.model)
    engines = EngineReplicas([one.engine] * processes_needed(initial, autoscale), rc.scheduler, rc.cache,
                             initial=initial)

    def serve(requests, router, scaling, policy, on_step) -> ElasticResult:
        return run_elastic_wall(engines, initial, requests, router, WallClock(), scaling, policy, on_step)

    def blocks(n: int) -> list[int]:
        first = engines.infos[0]
        assert first is not None, "the initial replicas are loaded before the run"
        assert len(engines.infos) == n, "one replica process per lifetime"
        return [(info or first).num_blocks for info in engines.infos]  # one never ready: as the first

    with engines:
        first = engines.infos[0]
        assert first is not None
        yield ElasticFleet(first, serve, blocks)
