"""Allocate a model built on the meta device: real, uninitialised storage for each parameter.

Building on "meta" costs no memory and no random init; the loader then fills every parameter.
Unlike nn.Module.to_empty, this keeps each Parameter's attributes (its weight_loader) and keeps
tied parameters tied (one Parameter shared by two modules stays one).
"""

from __future__ import annotations

import torch
from torch import nn


def materialize_parameters(model: nn.Module, device: torch.device | str, dtype: torch.dtype) -> None:
    replaced: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in replaced:
                new = nn.Parameter(torch.empty(param.shape, device=device, dtype=dtype), requires_grad=False)
                new.__dict__.update(param.__dict__)  # custom attributes such as weight_loader
                replaced[id(param)] = new
            module._parameters[name] = replaced[id(param)]
