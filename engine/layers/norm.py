"""RMSNorm, optionally fused with the residual add that precedes it in a pre-norm block, and
with the tensor-parallel sum before that (partial_of: x is this rank's partial sum)."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.fused import UsesFusedKernels
from engine.layers.parallel import TensorParallel


class RMSNorm(nn.Module, UsesFusedKernels):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.fused_kernels = None

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32 whatever the model dtype; scaled by the weight in the model dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, partial_of: TensorParallel | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [..., dim]. With residual: returns (norm(x + residual), x + residual). With
        partial_of, x is summed over partial_of's ranks first. x [T, terms, dim] beside a residual
        [T, dim] is a sum still to be taken (engine.layers.moe's top-k outputs, sum_in_norm): the
        fused kernel adds the terms as it reads them."""
        fused = self.fused_kernels
        if residual is not None and x.dim() == residual.dim() + 1 and (
                partial_of is not None or fused is None or not fused.applies(x)):
            x = x.sum(dim=-2)
        if partial_of is not None:
            done = None
            if fused is not None and residual is not None and fused.applies(x):
                done = partial_of.reduce_add_rms_norm(x, residual, self.weight, self.eps)
            if done is not None:
                return done
            x = partial_of.reduce(x)
        if fused is not None and fused.applies(x):
            # one kernel: reads x (and residual) once, writes the norm (and the new residual)
            if residual is None:
                return fused.rms_norm(x, self.weight, self.eps)
            return fused.add_rms_norm(x, residual, self.weight, self.eps)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
