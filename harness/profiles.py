"""The calibrated step-timing profiles shipped with the project: profiles/<hardware>/<model>.csv,
<hardware> a conf/hardware entry's name (h100, h200) and <model> a conf/model name (qwen3-8b).

backend.cost_model=profiled with backend.profile_path=null prices steps with the shipped profile
of the run's hardware and model; a pair without one is refused in one line that lists the pairs
there are. Every shipped profile was measured at tensor-parallel size 1 (profiles/README.md), so
a run at a larger size prices it through the TP transfer.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from harness.convert import ConfigError
from harness.paths import CONF_DIR, REPO_ROOT

PROFILES_DIR = REPO_ROOT / "profiles"
PROFILE_TP_SIZE = 1  # the tensor-parallel size every shipped profile was measured at


def shipped_profiles(root: Path = PROFILES_DIR) -> list[str]:
    """The shipped profiles as "<hardware>/<model>", sorted."""
    return sorted(f"{p.parent.name}/{p.stem}" for p in root.glob("*/*.csv"))


def hardware_conf_name(spec_name: str) -> str | None:
    """The conf/hardware entry whose `name` is spec_name (H100-SXM5-80GB -> h100), None if none is."""
    for path in sorted((CONF_DIR / "hardware").glob("*.yaml")):
        if OmegaConf.load(path).get("name") == spec_name:
            return path.stem
    return None


def shipped_profile_or_none(hardware_name: str | None, model_name: str, root: Path = PROFILES_DIR) -> Path | None:
    """The shipped profile of the hardware (its spec name, as the hardware section carries it) and
    the model (its conf/model name), None when there is none."""
    conf_name = hardware_conf_name(hardware_name) if hardware_name else None
    path = root / str(conf_name) / f"{model_name}.csv"
    return path if conf_name is not None and path.is_file() else None


def shipped_profile(hardware_name: str | None, model_name: str, root: Path = PROFILES_DIR) -> Path:
    """shipped_profile_or_none's profile; ConfigError naming backend.profile_path when there is none."""
    path = shipped_profile_or_none(hardware_name, model_name, root)
    if path is not None:
        return path
    conf_name = hardware_conf_name(hardware_name) if hardware_name else None
    where = f"hardware={conf_name}" if conf_name else f"hardware {hardware_name!r}"
    raise ConfigError(f"backend.profile_path: no shipped profile for model={model_name} on {where} "
                      f"(profiles/ has {', '.join(shipped_profiles(root)) or 'none'}); set backend.profile_path "
                      "to a step-timing CSV or use backend.cost_model=roofline")


def shipped_power_curve(hardware, model_name: str, root: Path = PROFILES_DIR) -> Path:  # hardware: HardwareSpec
    """The shipped power curve (profiles/<hardware>/<model>.power.json, sim.power_limit) that prices
    the model on this GPU: its own, else one measured on a GPU of the same die and power limit;
    ConfigError naming backend.power_curve and the curves there are where none does."""
    from sim.power_limit import read_power_curve

    curves = sorted(root.glob(f"*/{model_name}.power.json"))
    own = [p for p in curves if p.parent.name == hardware_conf_name(hardware.name)]
    for path in own + [p for p in curves if p not in own]:
        if read_power_curve(path).prices(hardware):
            return path
    shipped = ", ".join(f"{p.parent.name}/{p.name}" for p in sorted(root.glob("*/*.power.json"))) or "none"
    gpu = f"{hardware.chip or 'die unknown'}, {hardware.power_limit_w or '?'} W"
    raise ConfigError(f"backend.power_curve=auto: no shipped power curve prices model={model_name} on {hardware.name} "
                      f"({gpu}; profiles/ has {shipped}); set backend.power_curve to a curve's JSON or null")


__all__ = ["PROFILES_DIR", "PROFILE_TP_SIZE", "hardware_conf_name", "shipped_power_curve", "shipped_profile",
           "shipped_profile_or_none", "shipped_profiles"]
