"""Random-weight checkpoints for the engine backend when no checkpoint folder is given.

`backend=engine model=qwen3-0.6b` with backend.model left null serves a checkpoint of that model's
published shape with random weights (real speed, no hub): written once, on first use, to
checkpoints/<preset>/ under the repository root (git-ignored), then reused. The folder appears only
once the write is complete (engine.checkpoint), so a run interrupted while writing it leaves
nothing that a later run would take for a checkpoint: that run writes it again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from harness.convert import ConfigError
from harness.paths import REPO_ROOT

log = logging.getLogger(__name__)
CHECKPOINT_ROOT = REPO_ROOT / "checkpoints"


def preset_for(model_spec) -> str:
    """The checkpoint preset of the model config: its name, when the spec is that preset's shape."""
    from engine.core.model_shapes import MODEL_SHAPES
    from sim.specs import ModelSpec

    shape = MODEL_SHAPES.get(model_spec.name)
    if shape is None:
        raise ConfigError(
            f"backend.model: no checkpoint folder given and model {model_spec.name!r} has no random-weight "
            f"preset (known: {sorted(MODEL_SHAPES)}); pass backend.model=DIR"
        )
    preset_spec = ModelSpec.from_shape(shape)
    changed = sorted(k for k, v in vars(model_spec).items() if getattr(preset_spec, k) != v)
    if changed:
        raise ConfigError(
            f"backend.model: no checkpoint folder given, and the {shape.name} checkpoint would not have the "
            f"overridden model field(s) {changed}; pass backend.model=DIR or drop the overrides"
        )
    return shape.name


def default_checkpoint_dir(model_spec) -> Path:
    return CHECKPOINT_ROOT / preset_for(model_spec)


def ensure_checkpoint(model_dir: str, model_spec) -> None:
    """Write the default checkpoint if model_dir is the model's default folder and holds none yet."""
    path = Path(model_dir)
    if path != CHECKPOINT_ROOT / model_spec.name:
        return
    from engine.checkpoint import is_complete, write_checkpoint

    if is_complete(path):
        return
    if path.exists():
        log.warning("%s is an incomplete checkpoint (an interrupted write?); writing it again", path)
    else:
        log.info("writing a random-weight %s checkpoint to %s (first use)", model_spec.name, path)
    write_checkpoint(preset_for(model_spec), path, seed=0)
