"""The composed Hydra config, converted into frozen dataclasses before anything runs.

Layout of the composed config (conf/config.yaml):
  model, hardware      -> sim.specs.ModelSpec, HardwareSpec (the simulator prices with them)
  scheduler, cache     -> engine.core SchedulerConfig, CacheConfig
  workload             -> harness.workloads.WorkloadConfig
  execution            -> engine.core ExecutionConfig, built once and handed to either backend
  backend              -> name "sim" + SimConfig fields, or name "engine" + EngineConfig fields
  study                -> harness.study.StudyConfig: what to do with it (one run, a sweep, a capacity search, ...)
  output               -> OutputConfig
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from engine.core import CacheConfig, ExecutionConfig, SchedulerConfig
from harness.backends import BACKENDS
from harness.checkpoints import default_checkpoint_dir, preset_for
from harness.convert import ConfigError, to_dataclass
from harness.paths import CONF_DIR, REPO_ROOT
from harness.workloads import WorkloadConfig

__all__ = ["CONF_DIR", "REPO_ROOT", "RunConfig", "build_run_config", "existing_path", "section"]
# Keys of the backend groups that live in the shared execution section.
MOVED_KEYS = {
    "enforce_eager": "execution.enforce_eager",
    "async_scheduling": "execution.async_scheduling",
    "prefill_graph_tokens": "execution.prefill_graph_tokens",
    "max_cuda_graph_batch_size": "execution.max_graph_batch_size",
    "tensor_parallel_size": "execution.tensor_parallel_size",
    "tp_size": "execution.tensor_parallel_size",
    "expert_parallel": "execution.expert_parallel",
    "seed": "execution.seed",
    "gpu_memory_utilization": "execution.gpu_memory_utilization",
    "all_reduce": "execution.all_reduce",
}
STEP_OUTPUTS = ("full", "none")


@dataclass(frozen=True)
class CapacityConfig:
    """Highest Poisson rate whose P`percentile` TTFT and TPOT meet the SLO, by bisection."""

    ttft_slo_s: float = 1.0
    tpot_slo_s: float = 0.05
    percentile: float = 90.0
    # req/s; must meet the SLO, else the capacity is reported as 0. None: a quarter of the offline
    # throughput (a very low rate is slow to simulate: every request runs alone).
    rate_low: float | None = None
    rate_high: float | None = None  # None: the offline request throughput (doubled while it passes)
    rel_tol: float = 0.02  # stop when (high - low) / high is below this
    max_probes: int = 20

    def __post_init__(self) -> None:
        for name in ("ttft_slo_s", "tpot_slo_s", "rate_low", "rel_tol"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"study.capacity.{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"study.capacity.percentile must be in (0, 100], got {self.percentile}")
        if self.rate_high is not None and self.rate_low is not None and not self.rate_high > self.rate_low:
            raise ValueError(f"study.capacity.rate_high must be > rate_low={self.rate_low}, got {self.rate_high}")
        if self.max_probes < 1:
            raise ValueError(f"study.capacity.max_probes must be >= 1, got {self.max_probes}")


@dataclass(frozen=True)
class OutputConfig:
    progress: bool = True  # tqdm bar per run
    plots: bool = True  # PNGs for each run (a sweep always plots its curve)
    point_outputs: bool = True  # a sweep writes each point's CSVs under points/
    steps: str = "full"  # full: each run's per-step table (steps.csv.gz); none: not written

    def __post_init__(self) -> None:
        if self.steps not in STEP_OUTPUTS:
            raise ValueError(f"output.steps must be one of {STEP_OUTPUTS}, got {self.steps!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, validated; engine/ and sim/ only ever see these dataclasses."""

    backend: str
    scheduler: SchedulerConfig
    cache: CacheConfig
    workload: WorkloadConfig
    model: Any  # sim.specs.ModelSpec
    hardware: Any  # sim.specs.HardwareSpec
    sim: Any = None  # sim.config.SimConfig when backend == "sim"
    engine: Any = None  # engine.config.EngineConfig when backend == "engine"


def section(cfg: DictConfig, key: str) -> Any:
    """A resolved plain-Python copy of cfg[key]; missing mandatory values become ConfigError."""
    if key not in cfg:
        raise ConfigError(f"{key}: section missing from the config")
    try:
        node = cfg[key]
        if not OmegaConf.is_config(node):
            return node
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        full_key = getattr(error, "full_key", None) or key
        raise ConfigError(f"{full_key}: {str(error).splitlines()[0]}") from None


def model_spec(data: Any) -> Any:
    """The model section as a sim.specs.ModelSpec: the named preset's fields, then the section's own."""
    from sim.specs import ModelSpec, preset_fields

    if not isinstance(data, dict):
        return to_dataclass(ModelSpec, data, "model")  # which names the problem
    own = dict(data)
    if "kv_cache_dtype" in own:
        raise ConfigError("model.kv_cache_dtype: the KV cache's dtype is set by cache.kv_cache_dtype")
    preset = own.pop("preset", None)
    if preset is None:
        return to_dataclass(ModelSpec, own, "model")
    try:
        base = preset_fields(preset)
    except ValueError as error:
        raise ConfigError(f"model.preset: {error}") from None
    return to_dataclass(ModelSpec, {**base, **own}, "model")


def build_run_config(cfg: DictConfig) -> RunConfig:
    from sim.config import SimConfig
    from sim.specs import HardwareSpec

    backend = dict(section(cfg, "backend"))
    name = backend.pop("name", None)
    if name not in BACKENDS:
        raise ConfigError(BACKENDS.unknown(name))
    for key in backend:
        if key in MOVED_KEYS:
            raise ConfigError(f"backend.{key} is not a backend setting: set {MOVED_KEYS[key]} "
                              "(shared by both backends)")
    backend["execution"] = to_dataclass(ExecutionConfig, section(cfg, "execution"), "execution")
    hardware = to_dataclass(HardwareSpec, section(cfg, "hardware"), "hardware")
    sim_cfg = engine_cfg = None
    if name == "sim":
        if backend.get("profile_hardware") is not None:
            backend["profile_hardware"] = load_hardware(backend["profile_hardware"], "backend.profile_hardware")
        if backend.get("profile_path"):
            backend["profile_path"] = existing_path(backend["profile_path"], "backend.profile_path")
        elif backend.get("cost_model") == "profiled":
            backend.update(_shipped_profile(cfg, backend))
        if backend.get("power_curve") == "auto":
            from harness.profiles import shipped_power_curve

            backend["power_curve"] = str(shipped_power_curve(hardware, model_spec(section(cfg, "model")).name))
        elif backend.get("power_curve"):
            backend["power_curve"] = existing_path(backend["power_curve"], "backend.power_curve")
        if backend.get("launch_line_grid"):
            backend["launch_line_grid"] = existing_path(backend["launch_line_grid"], "backend.launch_line_grid")
        sim_cfg = to_dataclass(SimConfig, backend, "backend")
    else:
        from engine.config import EngineConfig

        if backend.get("model") is None and backend.get("load_format") == "dummy":
            backend["model"] = preset_for(model_spec(section(cfg, "model")))  # engine.dummy: no folder
        elif backend.get("model") is None:
            backend["model"] = str(default_checkpoint_dir(model_spec(section(cfg, "model"))))
        elif isinstance(backend["model"], str):
            backend["model"] = str(_resolve_path(backend["model"]))
        engine_cfg = to_dataclass(EngineConfig, backend, "backend")
    cache = to_dataclass(CacheConfig, section(cfg, "cache"), "cache")
    return RunConfig(
        backend=name,
        scheduler=to_dataclass(SchedulerConfig, section(cfg, "scheduler"), "scheduler"),
        cache=cache,
        workload=to_dataclass(WorkloadConfig, section(cfg, "workload"), "workload"),
        model=model_spec(section(cfg, "model")).with_kv_cache(cache.kv_cache_dtype),
        hardware=hardware,
        sim=sim_cfg,
        engine=engine_cfg,
    )


def _shipped_profile(cfg: DictConfig, backend: dict) -> dict:
    """profile_path (and the TP size it was measured at, unless set) of the profile's hardware (the
    run's unless backend.profile_hardware names another) and the model."""
    from harness.profiles import PROFILE_TP_SIZE, shipped_profile

    hardware = section(cfg, "hardware")
    measured_on = backend.get("profile_hardware")
    path = shipped_profile(measured_on.name if measured_on is not None
                           else hardware.get("name") if isinstance(hardware, dict) else None,
                           model_spec(section(cfg, "model")).name)
    return {"profile_path": str(path), "profile_tp_size": backend.get("profile_tp_size") or PROFILE_TP_SIZE}


def load_hardware(name: str, where: str):  # -> sim.specs.HardwareSpec
    """The HardwareSpec of conf/hardware/<name>.yaml; a ConfigError naming where and the entries there are."""
    from sim.specs import HardwareSpec

    path = CONF_DIR / "hardware" / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in (CONF_DIR / "hardware").glob("*.yaml"))
        raise ConfigError(f"{where}: no entry conf/hardware/{name}.yaml; available: {available}")
    return to_dataclass(HardwareSpec, OmegaConf.to_container(OmegaConf.load(path), resolve=True), f"hardware/{name}")


def on_hardware(rc: RunConfig, hardware) -> RunConfig:  # hardware: sim.specs.HardwareSpec
    """rc run on another GPU (a planner's candidate, a disaggregated pool). A profiled simulator
    follows the GPU: the shipped profile of the new GPU where the run priced with the shipped
    profile of its own and the new GPU has one; otherwise the run's profile, carried from the GPU
    it was measured on (sim.transfer)."""
    from harness.profiles import shipped_profile_or_none

    moved = dataclasses.replace(rc, hardware=hardware)
    sim = rc.sim
    if sim is None or sim.cost_model != "profiled" or hardware.name == rc.hardware.name:
        return moved
    if sim.power_curve is not None and not _curve_prices(sim.power_curve, hardware):
        raise ConfigError(f"backend.power_curve {sim.power_curve} was measured on a GPU of another die or power limit "
                          f"than {hardware.name}: a run moved there needs its curve (set backend.power_curve=null "
                          "to price without)")
    measured_on = sim.profile_hardware or rc.hardware
    own = shipped_profile_or_none(hardware.name, rc.model.name)
    if own is not None and shipped_profile_or_none(measured_on.name, rc.model.name) == Path(str(sim.profile_path)):
        return dataclasses.replace(moved, sim=dataclasses.replace(sim, profile_path=str(own), profile_hardware=None))
    carried_from = None if measured_on.name == hardware.name else measured_on
    return dataclasses.replace(moved, sim=dataclasses.replace(sim, profile_hardware=carried_from))


def _curve_prices(path: str, hardware) -> bool:  # hardware: sim.specs.HardwareSpec
    """Whether the power curve at path holds on hardware (sim.power_limit.PowerCurve.prices)."""
    from sim.power_limit import read_power_curve

    try:
        return read_power_curve(path).prices(hardware)
    except ValueError as error:
        raise ConfigError(f"backend.power_curve: {error}") from None


def moved_override(overrides: list[str]) -> str | None:
    """The error for a command-line override of a key that moved to the execution section (Hydra
    itself would only say the key is unknown), None when there is none."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        group, _, field = key.partition(".")
        if group == "backend" and field in MOVED_KEYS:
            return f"{key} is not a backend setting: set {MOVED_KEYS[field]} (shared by both backends)"
    return None


def existing_path(value: str | None, field: str) -> str | None:
    """value resolved as _resolve_path does; a ConfigError naming field when nothing is there."""
    if value is None:
        return None
    path = _resolve_path(value)
    if not path.exists():
        raise ConfigError(f"{field}: no such file or folder {value!r} (relative paths: from the cwd or the repository)")
    return str(path)


def _resolve_path(value: str) -> Path:
    """Relative paths are taken from the cwd when they exist there, else from the repository root."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve() if path.exists() else path
    candidate = REPO_ROOT / path
    return candidate if candidate.exists() else path
