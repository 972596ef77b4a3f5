"""Routed tokens per expert and MoE layer, as the engine served them (EngineConfig.record_expert_counts).

The simulator prices an MoE step by the distinct experts its tokens touch, which depends on how
unevenly the router spreads them (sim.moe: the routing skew); sim.moe.fit_routing_skew estimates
that skew from these counts. Recording is off by default. On, the model holds one ExpertCounter
(engine.layers.moe.attach_expert_counter):
a [MoE layers, E] int32 tensor on the device that every MoE layer adds its step's (token, expert)
choices to, inside the CUDA graphs (on CUDA the router kernel adds them with atomics:
kernels.moe_route; the torch path with one scatter-add), so nothing is read on the host until
take() is called. Only real tokens count: the model hands the counter each step's KV-cache slot
mapping, where a CUDA graph's padding rows have -1 (engine.cuda_graph, engine.prefill_graphs).

Counts are cumulative until take(), which returns them and starts again from zero: take() before a
measured run drops what warm-up and profiling steps routed. int32 holds 2^31 tokens per expert
and layer, about 3 * 10^10 routed tokens of a 128-expert top-8 model between two take()s.
Files: expert_counts.csv, one row per (layer, expert): layer (the model's layer index), expert,
tokens (write_expert_counts; sim.moe.read_routing_counts reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

COLUMNS = ("layer", "expert", "tokens")


@dataclass(frozen=True)
class ExpertCounts:
    layers: tuple[int, ...]  # the model's layer index of each row
    tokens: np.ndarray  # [len(layers), num_experts] int64: (token, expert) choices routed

    def frame(self):
        import pandas as pd

        num_experts = self.tokens.shape[1]
        return pd.DataFrame({"layer": np.repeat(self.layers, num_experts),
                             "expert": np.tile(np.arange(num_experts), len(self.layers)),
                             "tokens": self.tokens.reshape(-1)})


class ExpertCounter:
    """One model replica's counts (module docstring)."""

    def __init__(self, layers: list[int], num_experts: int, device: torch.device | str) -> None:
        self.layers = tuple(layers)
        self.counts = torch.zeros((len(layers), num_experts), dtype=torch.int32, device=device)
        self.valid: torch.Tensor | None = None  # the step's slot mapping [tokens]: >= 0 is a real token

    def record(self, row: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(counter row [E] int32, the step's slot mapping) for MoE layer `row`, None outside a step."""
        return None if self.valid is None else (self.counts[row], self.valid)

    def take(self) -> ExpertCounts:
        """The counts since the last take() (a device sync), and zero again."""
        tokens = self.counts.cpu().numpy().astype(np.int64)
        self.counts.zero_()
        return ExpertCounts(self.layers, tokens)


def add_counts(record: tuple[torch.Tensor, torch.Tensor], ids: torch.Tensor) -> None:
    """The torch path's recording: ids [T, k] of the step's tokens into the counter row, the tokens
    whose slot is -1 (graph padding) left out. No host sync: capturable like the kernel's."""
    row, valid = record
    real = (valid >= 0).to(row.dtype).repeat_interleave(ids.shape[1])
    row.scatter_add_(0, ids.reshape(-1).to(torch.int64), real)


def write_expert_counts(counts: ExpertCounts, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    counts.frame().to_csv(path, index=False)
    return path
