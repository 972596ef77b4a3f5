"""fleet=disaggregated: the fleet section as frozen dataclasses, and each pool's RunConfig.

A pool's GPUs: its hardware entry's gpus_per_node (one HGX board). A pool's TP group lives inside
one node, so its tp_size may not exceed that; link=nvlink puts the whole fleet in one NVLink
domain, so both pools must be the same GPU type and all their GPUs fit one node.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from engine.core.kv_staging import link_staging_blocks
from engine.core.routers import ROUTERS
from harness.config import RunConfig, load_hardware, on_hardware, section
from harness.convert import ConfigError, to_dataclass
from harness.fleet.config import backend_tp_size, with_tp_size
from sim.host_speed import check_host_scale
from sim.kv_transfer import TransferConfig

MODE = "disaggregated"


@dataclass(frozen=True)
class PoolConfig:
    """tp_size: each replica's TP size (null: the backend's); hardware: a conf/hardware entry (null: the run's);
    autoscale: this pool's autoscale settings over the autoscale section's, e.g. {policy: queue,
    max_replicas: 4} (null: a pool of fixed size; harness.autoscale.disagg); host_scale: this pool's
    serving host's speed against the profile's (sim.host_speed; null: backend.host_scale): one fleet's
    replicas can launch at different speeds (experiments/disagg/h200_06b_run9: a prefill replica at up
    to 1.7x its fit where its decode replica measured 0.9x)."""

    tp_size: int | None = None
    hardware: str | None = None
    autoscale: dict[str, Any] | None = None
    host_scale: float | None = None


@dataclass(frozen=True)
class DisaggConfig:
    mode: str = MODE
    prefill_replicas: int = 1
    decode_replicas: int = 1
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    prefill_router: str | None = None  # null: router.name
    decode_router: str | None = None
    transfer: TransferConfig = field(default_factory=TransferConfig)

    def __post_init__(self) -> None:
        if self.mode != MODE:
            raise ValueError(f"fleet.mode must be {MODE!r} here, got {self.mode!r}")
        for name in ("prefill_replicas", "decode_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"fleet.{name} must be an int >= 1 (a pool needs a replica), got {value!r}")
        for pool in ("prefill", "decode"):
            tp = getattr(self, pool).tp_size
            if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
                raise ValueError(f"fleet.{pool}.tp_size must be an int >= 1 or null, got {tp!r}")
            if getattr(self, pool).host_scale is not None:
                check_host_scale(getattr(self, pool).host_scale, f"fleet.{pool}.host_scale")
            router = getattr(self, f"{pool}_router")
            if router is not None and router not in ROUTERS:
                raise ValueError(f"fleet.{pool}_router must be one of {list(ROUTERS)} or null, got {router!r}")


def is_disaggregated(cfg: DictConfig) -> bool:
    return "fleet" in cfg and cfg.fleet.get("mode") == MODE


def build_disagg(cfg: DictConfig) -> DisaggConfig:
    data = section(cfg, "fleet")
    for pool in ("prefill", "decode"):
        data[pool] = to_dataclass(PoolConfig, data.get(pool) or {}, f"fleet.{pool}")
    data["transfer"] = to_dataclass(TransferConfig, data.get("transfer") or {}, "fleet.transfer")
    return to_dataclass(DisaggConfig, data, "fleet")  # type: ignore[no-any-return]


def pool_run_configs(rc: RunConfig, fleet: DisaggConfig) -> tuple[RunConfig, RunConfig]:
    """The prefill and the decode replicas' RunConfigs, each pool checked against its GPUs and the link."""
    pools = []
    for pool in ("prefill", "decode"):
        spec: PoolConfig = getattr(fleet, pool)
        hardware = rc.hardware if spec.hardware is None else load_hardware(spec.hardware, f"fleet.{pool}.hardware")
        tp = spec.tp_size if spec.tp_size is not None else backend_tp_size(rc)
        try:
            hardware.check_tp_in_node(tp)
        except ValueError as error:
            raise ConfigError(f"fleet.{pool}.tp_size: {error}") from None
        pool_rc = on_hardware(with_tp_size(rc, tp, f"fleet.{pool}.tp_size"), hardware)
        pools.append(pool_rc if spec.host_scale is None else at_pool_host(pool_rc, spec.host_scale, pool))
    prefill, decode = pools
    if fleet.transfer.link == "nvlink":
        if prefill.hardware.name != decode.hardware.name:
            raise ConfigError(f"fleet.transfer.link=nvlink joins one GPU type, but the pools are "
                              f"{prefill.hardware.name} and {decode.hardware.name}: use fleet.transfer.link=network")
        gpus = fleet.prefill_replicas * backend_tp_size(prefill) + fleet.decode_replicas * backend_tp_size(decode)
        if gpus > prefill.hardware.gpus_per_node:
            raise ConfigError(f"fleet.transfer.link=nvlink: the fleet's {gpus} GPUs exceed one node's "
                              f"{prefill.hardware.gpus_per_node}: use fleet.transfer.link=network")
    return prefill, decode


def at_pool_host(rc: RunConfig, host_scale: float, pool: str) -> RunConfig:
    """rc with its simulated replicas' host at host_scale times the profile's (fleet.<pool>.host_scale)."""
    if rc.backend != "sim" or rc.sim.cost_model != "profiled":
        raise ConfigError(f"fleet.{pool}.host_scale prices a profiled model's host parts: it needs backend=sim "
                          f"backend.cost_model=profiled (an engine's hosts are its own; the roofline has none)")
    return dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, host_scale=host_scale))


def pool_staging_blocks(pools: tuple[RunConfig, RunConfig], counts: tuple[int, int]) -> tuple[int, int]:
    """The KV link staging a prefill and a decode replica keep out of their KV cache, in blocks of
    their cache's layout, as the engine's replicas of this fleet plan it (engine.replica_main:
    link_staging_blocks over ranks prefill first, each a peer of its pool's TP size). counts: the
    replicas each pool may have at once (an autoscaled pool's max_replicas: a plan is made once)."""
    tps = (backend_tp_size(pools[0]),) * counts[0] + (backend_tp_size(pools[1]),) * counts[1]
    prefill, decode = (link_staging_blocks(role, rank, counts[0], tps,
                                           -(-pool.scheduler.max_model_len // pool.cache.block_size))
                       for role, rank, pool in (("prefill", 0, pools[0]), ("decode", counts[0], pools[1])))
    return prefill, decode
