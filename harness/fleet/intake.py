"""The engine fleet's request intake as a simulated fleet prices it (backend.fleet_intake=true).

profiles/<hardware>/fleet_intake.json (a conf/hardware name) holds what
experiments/disagg/fleet_intake.py measured on that GPU host: base_s and per_token_s of
engine.core.intake.Intake (from a request's arrival until its replica's loop can see it: the
router's hand-over to the replica's sender thread, the pipe, the replica's read) and poll_lag_s (a
stepping replica reads its pipe that long after a step's end), with the command that measured
them. The figure belongs to the host and the engine's code, not to a model: a prompt costs its
tokens' bytes whatever model reads them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from engine.core.intake import Intake
from engine.core.loop import Replica
from harness.config import RunConfig
from harness.convert import ConfigError
from harness.profiles import PROFILES_DIR, hardware_conf_name

FILE = "fleet_intake.json"
FIELDS = ("base_s", "per_token_s", "poll_lag_s", "command")


def intake_path(hardware_conf: str, root: Path = PROFILES_DIR) -> Path:
    return root / hardware_conf / FILE


def read_intake(path: Path) -> Intake:
    """A calibration file's Intake; ConfigError naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: not a fleet intake calibration ({error})") from None
    missing = [k for k in FIELDS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ConfigError(f"{path}: a fleet intake calibration needs {missing}")
    try:
        return Intake(float(data["base_s"]), float(data["per_token_s"]), float(data["poll_lag_s"]))
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{path}: {error}") from None


def fleet_intake(rc: RunConfig, root: Path = PROFILES_DIR) -> Intake | None:
    """The intake a simulated fleet of rc's replicas prices: None unless backend.fleet_intake is on;
    ConfigError where the run's hardware has no measured figure."""
    if rc.backend != "sim" or not rc.sim.fleet_intake:
        return None
    conf = hardware_conf_name(rc.hardware.name)
    path = intake_path(str(conf), root)
    if conf is None or not path.is_file():
        measured = sorted(p.parent.name for p in root.glob(f"*/{FILE}"))
        raise ConfigError(f"backend.fleet_intake=true: no measured fleet intake for hardware {rc.hardware.name} "
                          f"({path}); measured for {measured}: set backend.fleet_intake=false or measure it "
                          "(experiments/disagg/fleet_intake.py)")
    return read_intake(path)


def with_intake(replicas: Iterable[Replica], intake: Intake | None) -> None:
    """Give each replica the fleet's intake (None: none)."""
    for replica in replicas:
        replica.intake = intake
