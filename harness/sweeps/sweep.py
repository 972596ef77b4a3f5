"""In-process sweeps: one run per value of a config key, one summary row each, one curve.

Every point is converted (and so validated) before the first one runs, so a bad value fails in a
second, not after an hour. For sweeps that need parallel processes use Hydra's own multirun
(`python -m harness -m key=a,b,c hydra/launcher=joblib`) and `python -m harness.report`.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from harness.config import CONF_DIR, OutputConfig, RunConfig, build_run_config
from harness.convert import ConfigError
from harness.run import require_served, run_once, write_outcome
from harness.run_folder import write_csv

if TYPE_CHECKING:
    from harness.study import StudyConfig

GROUPS = ("model", "hardware", "workload", "scheduler", "backend")


def apply_override(cfg: DictConfig, param: str, value: Any) -> DictConfig:
    """A copy of cfg with param set to value; a group name swaps in conf/<group>/<value>.yaml."""
    point = copy.deepcopy(cfg)
    if param in GROUPS:
        path = CONF_DIR / param / f"{value}.yaml"
        if not path.is_file():
            options = sorted(p.stem for p in (CONF_DIR / param).glob("*.yaml"))
            raise ConfigError(f"study.values: no config {param}/{value}.yaml; available: {options}")
        with open_dict(point):
            point[param] = OmegaConf.load(path)
        return point
    try:
        OmegaConf.update(point, param, value, merge=False)
    except OmegaConfBaseException:
        raise ConfigError(f"study.param: {param!r} is not a key of the composed config") from None
    return point


def point_configs(cfg: DictConfig, study: StudyConfig) -> list[tuple[Any, RunConfig]]:
    points = []
    for value in study.values:
        try:
            points.append((value, build_run_config(apply_override(cfg, study.param, value))))
        except ConfigError as error:
            raise ConfigError(f"{error} (sweep point {study.param}={value})") from None
    return points


def slug(param: str, value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", f"{param.split('.')[-1]}={value}")


def run_sweep(cfg: DictConfig, study: StudyConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    from harness.output.plots import plot_sweep

    rows = []
    for value, rc in point_configs(cfg, study):
        label = f"{study.param}={value}"
        outcome = run_once(rc, output.progress, label=label)
        if output.point_outputs:
            write_outcome(outcome, out_dir / "points" / slug(study.param, value), output.plots, output.steps)
        require_served(outcome, f"sweep point {label}")
        rows.append({"param": study.param, "value": value, **outcome.summary.to_row()})
    table = pd.DataFrame(rows)
    write_csv(table, out_dir / "sweep.csv", index=False)
    plot_sweep(table, "value", study.metrics, out_dir / "sweep.png", log_x=study.log_x, xlabel=study.param,
               title=f"Sweep of {study.param}")
    return table
