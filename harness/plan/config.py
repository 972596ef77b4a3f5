"""The deployment search's config: the SLO, the search space and the priced hardware catalogue.

slo  -> SLOConfig (P90 TTFT and TPOT targets)
plan -> PlanConfig (the values each knob takes; conf/experiment/plan.yaml)
The catalogue is conf/hardware/<name>.yaml for each name in plan.hardware; every entry must carry
price_per_gpu_hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig

from engine.core.config import POLICIES
from engine.core.routers import ROUTERS
from harness.config import RunConfig, load_hardware, section
from harness.convert import ConfigError, refuse_unread, to_dataclass

MODES = ("aggregated", "disaggregated")
# A run's settings that the plan replaces by a list it searches: (section, field, that list).
SEARCHED = (("scheduler", "policy", "plan.policies"), ("scheduler", "max_num_seqs", "plan.max_num_seqs"),
            ("scheduler", "max_num_batched_tokens", "plan.max_num_batched_tokens"),
            ("execution", "tensor_parallel_size", "plan.tp_sizes"), ("router", "name", "plan.routers"),
            ("fleet", "replicas", "plan.max_replicas"), ("fleet", "tp_size", "plan.tp_sizes"),
            ("fleet", "tp_sizes", "plan.tp_sizes"))


@dataclass(frozen=True)
class SLOConfig:
    ttft_p90_s: float = 1.0
    tpot_p90_s: float = 0.05

    def __post_init__(self) -> None:
        for name in ("ttft_p90_s", "tpot_p90_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"slo.{name} must be a finite number > 0 (seconds), got {value!r}")


@dataclass(frozen=True)
class PlanConfig:
    """Every combination of hardware x tp_sizes x max_num_seqs x max_num_batched_tokens x policies
    x routers is one configuration; for each the search finds the fewest replicas (up to
    max_replicas) that meet the SLO. num_closest: deployments listed when none meets it.
    batch_size: deployments evaluated per round (harness.plan.search.search).
    expert_parallel: the expert placements searched for a mixture-of-experts model at a TP size
    above 1 (true: whole experts per rank, execution.expert_parallel; false: every expert sliced);
    a dense model, and TP 1, have one placement."""

    hardware: tuple[str, ...] = ("a100", "h100", "h200")
    tp_sizes: tuple[int, ...] = (1,)
    max_num_seqs: tuple[int, ...] = (256,)
    max_num_batched_tokens: tuple[int, ...] = (8192,)
    policies: tuple[str, ...] = ("nano",)
    routers: tuple[str, ...] = ("round_robin",)
    expert_parallel: tuple[bool, ...] = (False, True)
    max_replicas: int = 64
    num_closest: int = 5
    batch_size: int = 1  # deployments per evaluate_all() call: 1 prunes most; a parallel map wants its worker count
    # how evaluate_all() maps over a batch (harness.parallel.parallel_map): serial, processes, joblib or ray
    parallel_backend: str = "serial"
    parallel_address: str | None = None  # ray: a running cluster's address; None starts a local Ray
    parallel_num_workers: int | None = None
    # aggregated and/or disaggregated (harness.plan.disagg: P, D up to disagg_max_pool_replicas each,
    # at most disagg_max_evals simulations, cheapest first)
    modes: tuple[str, ...] = ("aggregated",)
    disagg_max_pool_replicas: int = 4
    disagg_max_evals: int = 48

    def __post_init__(self) -> None:
        if not self.modes or any(m not in MODES for m in self.modes):
            raise ValueError(f"plan.modes must list values of {list(MODES)}, got {list(self.modes)}")
        for name in ("hardware", "tp_sizes", "max_num_seqs", "max_num_batched_tokens", "policies", "routers",
                     "expert_parallel"):
            if not getattr(self, name):
                raise ValueError(f"plan.{name} must list at least one value")
        for name in ("tp_sizes", "max_num_seqs", "max_num_batched_tokens"):
            for i, value in enumerate(getattr(self, name)):
                if value < 1:
                    raise ValueError(f"plan.{name}[{i}] must be an int >= 1, got {value}")
        for i, value in enumerate(self.expert_parallel):
            if not isinstance(value, bool):
                raise ValueError(f"plan.expert_parallel[{i}] must be true or false, got {value!r}")
        for name, allowed in (("policies", POLICIES), ("routers", ROUTERS)):
            for i, value in enumerate(getattr(self, name)):
                if value not in allowed:
                    raise ValueError(f"plan.{name}[{i}] must be one of {list(allowed)}, got {value!r}")
        for name in ("max_replicas", "num_closest", "batch_size", "disagg_max_pool_replicas", "disagg_max_evals"):
            if getattr(self, name) < 1:
                raise ValueError(f"plan.{name} must be an int >= 1, got {getattr(self, name)}")
        from harness.parallel import check_backend

        check_backend(self.parallel_backend, self.parallel_address, self.parallel_num_workers, prefix="plan.parallel_")
        if "aggregated" not in self.modes:
            # the disaggregated search runs its candidates one by one, experts placed as
            # execution.expert_parallel says
            refuse_unread(self, "plan", [(name, "plan.modes including aggregated") for name in (
                "expert_parallel", "batch_size", "parallel_backend", "parallel_address", "parallel_num_workers")],
                f"plan.modes={list(self.modes)}")


def build_plan(cfg: DictConfig) -> tuple[PlanConfig, SLOConfig]:
    return (to_dataclass(PlanConfig, section(cfg, "plan"), "plan"),
            to_dataclass(SLOConfig, section(cfg, "slo"), "slo"))


def refuse_searched(cfg: DictConfig, rc: RunConfig) -> None:
    """A ConfigError for a run's setting the plan would silently replace (SEARCHED, set away from
    its default), a disaggregated fleet section or an autoscaler: plan.csv would answer another
    question than the one asked."""
    from harness.fleet.config import build_fleet
    from harness.fleet.disagg_config import is_disaggregated

    if is_disaggregated(cfg):
        raise ConfigError("fleet=disaggregated is ignored by experiment=plan, which builds its own fleets: set "
                          "'plan.modes=[disaggregated]' (or [aggregated,disaggregated]) and drop fleet=disaggregated")
    policy = (cfg.get("autoscale") or {}).get("policy")
    if policy is not None:
        raise ConfigError(f"autoscale.policy={policy!r} is ignored by experiment=plan, which prices fleets of fixed "
                          "size; set autoscale.policy=null")
    fleet, router = build_fleet(cfg)
    sections = {"scheduler": rc.scheduler, "execution": rc.sim.execution, "router": router, "fleet": fleet}
    for where, name, searched in SEARCHED:
        try:
            refuse_unread(sections[where], where, [(name, f"a run outside a plan (set {searched})")],
                          f"experiment=plan, which searches {searched}")
        except ValueError as error:
            raise ConfigError(str(error)) from None


def load_catalogue(names: tuple[str, ...]) -> dict:
    """name -> sim.specs.HardwareSpec from conf/hardware/<name>.yaml, each with a price."""
    catalogue = {}
    for i, name in enumerate(names):
        spec = load_hardware(name, f"plan.hardware[{i}]")
        if spec.price_per_gpu_hour is None:
            raise ConfigError(f"hardware/{name}.price_per_gpu_hour is missing: every plan.hardware entry needs "
                              "a $/GPU-hour figure (cited, or marked as an assumption)")
        catalogue[name] = spec
    return catalogue
