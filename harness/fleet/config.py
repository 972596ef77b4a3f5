"""The fleet and router sections of the composed config, as frozen dataclasses.

fleet  -> FleetConfig (replicas, TP per replica)
router -> engine.core.routers.RouterConfig
Each replica's RunConfig is the base one with its TP size written into the backend's config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass

from omegaconf import DictConfig

from engine.core.routers import RouterConfig, routers_reading
from harness.config import RunConfig, section
from harness.convert import ConfigError, refuse_unread, to_dataclass


@dataclass(frozen=True)
class FleetConfig:
    """replicas: how many copies of the engine serve the workload behind the router.
    tp_size: every replica's TP size (None: the backend's own); tp_sizes: one per replica, overriding it."""

    replicas: int = 1
    tp_size: int | None = None
    tp_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"fleet.replicas must be an int >= 1, got {self.replicas!r}")
        if self.tp_size is not None and self.tp_size < 1:
            raise ValueError(f"fleet.tp_size must be an int >= 1 or null, got {self.tp_size!r}")
        if self.tp_sizes and len(self.tp_sizes) != self.replicas:
            raise ValueError(f"fleet.tp_sizes must list one TP size per replica ({self.replicas}), "
                             f"got {len(self.tp_sizes)}: {list(self.tp_sizes)}")
        for i, tp in enumerate(self.tp_sizes):
            if tp < 1:
                raise ValueError(f"fleet.tp_sizes[{i}] must be an int >= 1, got {tp!r}")

    @property
    def is_single_run(self) -> bool:
        """One replica at the backend's own TP size: today's single run, unchanged."""
        return self.replicas == 1 and self.tp_size is None and not self.tp_sizes


def build_fleet(cfg: DictConfig, with_fleet: bool = True) -> tuple[FleetConfig, RouterConfig]:
    """with_fleet=False: the router only (fleet=disaggregated reads its fleet section itself)."""
    fleet = FleetConfig()
    if with_fleet and "fleet" in cfg:
        fleet = to_dataclass(FleetConfig, section(cfg, "fleet"), "fleet")
    router = to_dataclass(RouterConfig, section(cfg, "router"), "router") if "router" in cfg else RouterConfig()
    return fleet, router


def check_router_read(router: RouterConfig, routing: Collection[str], chosen: str,
                      name_unread: str | None = None) -> None:
    """A ConfigError for a router setting, set away from its default, that no router in use reads.
    routing: the routers that route (empty: one replica); chosen: the run, for the message;
    name_unread: what would read router.name when the run does not (None: it does, if routing)."""
    if not routing and name_unread is None:
        name_unread = "fleet.replicas > 1, fleet=disaggregated or an autoscale policy"
    unread = [] if name_unread is None else [("name", name_unread)]
    for setting in (f.name for f in dataclasses.fields(RouterConfig) if f.name != "name"):
        readers = routers_reading(setting)
        if not set(readers) & set(routing):
            unread.append((setting, f"router.name={' or '.join(readers)}"
                                    + ("" if routing else " routing more than one replica")))
    try:
        refuse_unread(router, "router", unread, chosen)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def backend_tp_size(rc: RunConfig) -> int:
    return (rc.sim if rc.backend == "sim" else rc.engine).execution.tensor_parallel_size


def with_tp_size(rc: RunConfig, tp: int, where: str = "fleet.tp_size") -> RunConfig:
    """rc with its backend's TP size set to tp; a ConfigError naming `where` unless tp divides the
    model's attention heads and divides or is a multiple of its KV heads (more ranks than KV heads:
    each rank keeps a replica of one, as the engine and sim.specs shard them)."""
    model = rc.model
    for heads in ("num_heads", "num_kv_heads"):
        count = getattr(model, heads)
        if count % tp and (heads == "num_heads" or tp % count):
            raise ConfigError(f"{where}: TP size {tp} does not divide model.{heads}={count} of {model.name}")
    side = rc.sim if rc.backend == "sim" else rc.engine
    side = dataclasses.replace(side, execution=dataclasses.replace(side.execution, tensor_parallel_size=tp))
    return dataclasses.replace(rc, **{"sim" if rc.backend == "sim" else "engine": side})


def replica_run_configs(rc: RunConfig, fleet: FleetConfig) -> list[RunConfig]:
    """One RunConfig per replica, each with its TP size checked against the model and the node."""
    if fleet.tp_sizes:
        return [in_node(with_tp_size(rc, tp, f"fleet.tp_sizes[{i}]"), f"fleet.tp_sizes[{i}]")
                for i, tp in enumerate(fleet.tp_sizes)]
    tp = fleet.tp_size if fleet.tp_size is not None else backend_tp_size(rc)
    return [in_node(with_tp_size(rc, tp, "fleet.tp_size"), "fleet.tp_size")] * fleet.replicas


def in_node(rc: RunConfig, where: str) -> RunConfig:
    """rc, or a ConfigError naming `where` when its TP group would span nodes of its hardware."""
    try:
        rc.hardware.check_tp_in_node(backend_tp_size(rc))
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None
    return rc
