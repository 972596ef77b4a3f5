"""Tensor-parallel placement of one model replica: which shard this process holds, and how
partial results are combined across ranks.

The collectives are plain functions handed in by whoever started the ranks (NCCL workers on
GPUs, threads in tests); with size 1 they are never called. Keeping them as arguments rather
than a process-global group lets several replicas live in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

Collective = Callable[[torch.Tensor], torch.Tensor]


class FusedReduceNorm(Protocol):
    """A group's one-launch (sum over ranks, + residual, RMSNorm): engine.tp.symmetric."""

    def applies_to_norm(self, x: torch.Tensor, residual: torch.Tensor) -> bool: ...

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    all_reduce: Collective | None = None  # elementwise sum over ranks, same shape out
    all_gather: Collective | None = None  # concatenation over ranks (rank order) along the last dim
    # Row-parallel outputs all feed a residual add + RMSNorm: with this, those three are one launch
    fused_reduce_norm: FusedReduceNorm | None = None
    # mixture-of-experts layers hold whole experts per rank instead of a slice of each (engine.layers.moe)
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tp_size={self.size} must be >= 1")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tp_rank={self.rank} must be in [0, {self.size - 1}]")
        if self.size > 1 and (self.all_reduce is None or self.all_gather is None):
            raise ValueError(f"tp_size={self.size} needs both all_reduce and all_gather collectives")

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else self.all_reduce(x)

    @property
    def defers_reduce(self) -> bool:
        """Whether row-parallel layers hand their partial sums to the norm after them, which reduces."""
        return self.size > 1

    def reduce_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The fused launch where the group has one that takes x, else None (reduce, then norm)."""
        fused = self.fused_reduce_norm
        if self.size > 1 and fused is not None and fused.applies_to_norm(x, residual):
            return fused.add_rms_norm(x, residual, weight, eps)
        return None

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else self.all_gather(x)

    def split(self, n: int, what: str) -> int:
        """Per-rank share of a dimension that must divide evenly."""
        if n % self.size:
            raise ValueError(f"{what}={n} must be divisible by tp_size={self.size}")
        return n // self.size
