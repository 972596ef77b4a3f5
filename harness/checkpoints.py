"""Random-weight checkpoints for the engine backend when no checkpoint folder is given.

`backend=engine model=qwen3_0_6b` with backend.model left null serves a checkpoint of that model's
published shape with random weights (real speed, no hub): written once, on first use, to
checkpoints/<preset>/ under the repository root (git-ignored), then reused.
"""

from __future__ import annotations

import logging
from pathlib import Path

from harness.config import REPO_ROOT
from harness.convert import ConfigError

log = logging.getLogger(__name__)
CHECKPOINT_ROOT = REPO_ROOT / "checkpoints"


def preset_for(model_spec) -> str:
    """The checkpoint preset named like the model config (ModelSpec.name 'Qwen3-0.6B' -> 'qwen3-0.6b')."""
    from engine.models.presets import PRESETS

    preset = model_spec.name.lower()
    if preset not in PRESETS:
        raise ConfigError(
            f"backend.model: no checkpoint folder given and model {model_spec.name!r} has no random-weight "
            f"preset (known: {sorted(PRESETS)}); pass backend.model=DIR"
        )
    return preset


def default_checkpoint_dir(model_spec) -> Path:
    return CHECKPOINT_ROOT / preset_for(model_spec)


def ensure_checkpoint(model_dir: str, model_spec) -> None:
    """Write the default checkpoint if model_dir is the model's default folder and is still empty."""
    path = Path(model_dir)
    if path != default_checkpoint_dir(model_spec) or (path / "config.json").exists():
        return
    from engine.checkpoint import write_checkpoint

    log.info("writing a random-weight %s checkpoint to %s (first use)", model_spec.name, path)
    write_checkpoint(preset_for(model_spec), path, seed=0)
