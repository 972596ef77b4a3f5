"""load_format="dummy": random weights of the model's shape made on the device, no checkpoint on disk.

The model's shape comes from a preset name (engine.core.model_shapes.MODEL_SHAPES, what the
harness's `model=` names), a ModelShape (LLM(shape, load_format="dummy")), or the config.json of
a folder. For a preset or a ModelShape a weightless folder (config.json, generation_config.json,
the project's tokenizer) is written to a temporary directory, removed when its owner is collected,
so that the rest of the engine reads a model the one way it always does.

Weights are drawn from normal(0, 0.02), the writer's scale (engine.checkpoint), so that logits
stay finite at any depth; norms are 1 and biases 0.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import torch
from torch import nn

from engine.core.model_shapes import MODEL_SHAPES, ModelShape

INIT_STD = 0.02


def has_config(model: str | Path) -> bool:
    return (Path(model) / "config.json").is_file()


def dummy_model_folder(model: str | Path | ModelShape, owner: object) -> str:
    """The folder the engine reads `model` from under load_format="dummy": `model` itself when it holds
    a config.json, else a weightless folder of the preset or shape, removed once `owner` is collected.
    ValueError (one line) when `model` names no shape."""
    if isinstance(model, ModelShape):
        shape = model
    elif has_config(model):
        return str(model)
    elif str(model) in MODEL_SHAPES:
        shape = MODEL_SHAPES[str(model)]
    else:
        raise ValueError(f"load_format='dummy': model {str(model)!r} has no shape; expected a preset name "
                         f"(one of {sorted(MODEL_SHAPES)}), a ModelShape or a folder with a config.json")
    from engine.checkpoint import write_model_files
    from engine.models.presets import hf_config

    folder = Path(tempfile.mkdtemp(prefix=f"dummy-{shape.name}-"))
    weakref.finalize(owner, shutil.rmtree, folder, True)
    write_model_files(folder, hf_config(shape), shape.dtype)
    return str(folder)


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Fill every parameter of `model` in place, on its own device: norms 1, biases 0, the rest
    normal(0, INIT_STD) from a generator seeded with `seed`."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            if param.device not in generators:
                generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
            param.normal_(0.0, INIT_STD, generator=generators[param.device])
