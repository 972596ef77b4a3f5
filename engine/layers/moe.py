"""A sparse mixture-of-experts block (Qwen3-MoE's): a router picks top-k SwiGLU experts per token.

The experts' weights are stacked, so that one grouped kernel (kernels.fused_moe) serves all of
them: w13 [num_experts, 2 * inter, hidden] (each expert's gate rows, then its up rows) and w2
[num_experts, hidden, inter]. Tensor parallelism splits every expert's intermediate dimension
like the dense MLP: a rank holds the same slice of gate, up (columns) and down (rows) of each
expert, so its output is a partial sum that the next norm (or an all-reduce) completes. The
router is replicated: every rank sees the same reduced input and so routes identically.

Checkpoints name each expert's projections separately (model.layers.N.mlp.experts.E.gate_proj.weight);
the weight loaders here take one such tensor (shard id (E, 0 | 1) for gate | up, E for down) or
one packed [num_experts, ...] tensor (shard id None, as transformers 5 holds them in memory).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.expert_counts import ExpertCounter, add_counts
from engine.layers.fused import UsesFusedKernels
from engine.layers.linear import ShardId, check_shape
from engine.layers.parallel import TensorParallel
from kernels.moe_reference import grouped_moe, route


class MoEExperts(nn.Module):
    """num_experts SwiGLU experts of width `intermediate`, this rank's slice of each."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, tp: TensorParallel):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.tp, self.per = tp, tp.split(intermediate, "moe_intermediate_size")
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * self.per, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, self.per), requires_grad=False)
        self.gate_up_proj.weight_loader = self.load_gate_up
        self.down_proj.weight_loader = self.load_down

    def _expert(self, shard_id: ShardId) -> int:
        expert = shard_id[0] if isinstance(shard_id, tuple) else shard_id
        if not isinstance(expert, int) or not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert!r} is not one of the model's {self.num_experts} experts")
        return expert

    def load_gate_up(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        per, first = self.per, self.tp.rank * self.per
        if shard_id is None:  # packed: [num_experts, 2 * inter, hidden], gate rows then up rows
            check_shape(param, (self.num_experts, 2 * self.intermediate, self.hidden), loaded)
            param.data[:, :per].copy_(loaded[:, first:first + per])
            param.data[:, per:].copy_(loaded[:, self.intermediate + first:self.intermediate + first + per])
            return
        expert, half = self._expert(shard_id), shard_id[1] if isinstance(shard_id, tuple) else None
        if half not in (0, 1):
            raise ValueError(f"shard_id={shard_id!r}: expected (expert, 0) for gate or (expert, 1) for up")
        check_shape(param, (self.intermediate, self.hidden), loaded)
        param.data[expert, half * per:(half + 1) * per].copy_(loaded[first:first + per])

    def load_down(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        per, first = self.per, self.tp.rank * self.per
        if shard_id is None:  # packed: [num_experts, hidden, inter]
            check_shape(param, (self.num_experts, self.hidden, self.intermediate), loaded)
            param.data.copy_(loaded[:, :, first:first + per])
            return
        check_shape(param, (self.hidden, self.intermediate), loaded)
        param.data[self._expert(shard_id)].copy_(loaded[:, first:first + per])


class SparseMoE(nn.Module, UsesFusedKernels):
    """Router + experts; forward returns this rank's partial sum when reduce_output is False.

    sum_in_norm: with the fused kernels, return the k weighted expert outputs per token unsummed,
    [T, k, hidden], for the RMSNorm after the layer to add as it reads them (engine.layers.norm;
    one launch and one pass over [T, hidden] fewer per layer). Only without tensor parallelism,
    where the output needs no all-reduce. The torch path always sums."""

    def __init__(self, num_experts: int, top_k: int, hidden: int, intermediate: int, renormalize: bool,
                 tp: TensorParallel, reduce_output: bool = True, sum_in_norm: bool = False):
        super().__init__()
        if sum_in_norm and tp.size > 1:
            raise ValueError("SparseMoE: sum_in_norm needs tp_size 1 (a partial sum is all-reduced first)")
        self.fused_kernels = None  # engine.layers.fused: kernels.fused_moe on CUDA
        self.top_k, self.renormalize, self.tp, self.reduce_output = top_k, renormalize, tp, reduce_output
        self.sum_in_norm = sum_in_norm
        self.gate = nn.Linear(hidden, num_experts, bias=False)  # the router, replicated
        self.experts = MoEExperts(num_experts, hidden, intermediate, tp)
        # engine.expert_counts: set when the engine records routed tokens per expert
        self.counter: ExpertCounter | None = None
        self.counter_row = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [T, hidden] -> [T, hidden] ([T, k, hidden] with sum_in_norm on the fused path)
        logits = self.gate(x)  # [T, E] in the model's dtype, as transformers' router computes them
        w13, w2 = self.experts.gate_up_proj, self.experts.down_proj
        record = self.counter.record(self.counter_row) if self.counter is not None else None
        fused = self.fused_kernels
        if fused is not None and fused.fused_moe is not None and fused.applies(x):
            # softmax, top-k, renormalisation and the alignment in one kernel (kernels.moe_route)
            out = fused.fused_moe(x, logits, w13, w2, self.top_k, self.renormalize, record=record,
                                  summed=not self.sum_in_norm)
        else:
            weights, ids = route(logits, self.top_k, self.renormalize)  # [T, k] each
            if record is not None:
                add_counts(record, ids)
            out = grouped_moe(x, w13, w2, weights, ids)
        return self.tp.reduce(out) if self.reduce_output else out


def attach_expert_counter(model: nn.Module, device: torch.device | str) -> ExpertCounter | None:
    """Give every MoE layer of `model` one shared counter (None for a dense model). Call before any
    CUDA graph is captured: the graphs hold the counter's address."""
    sparse = [(i, layer.mlp) for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, SparseMoE)]
    if not sparse:
        return None
    counter = ExpertCounter([i for i, _ in sparse], sparse[0][1].experts.num_experts, device)
    for row, (_, moe) in enumerate(sparse):
        moe.counter, moe.counter_row = counter, row
    model.expert_counter = counter
    return counter
