"""A sparse mixture-of-experts block (Qwen3-MoE's): a router picks top-k SwiGLU experts per token.

The experts' weights are stacked, so that one grouped kernel (kernels.fused_moe) serves all of
them: w13 [num_experts, 2 * inter, hidden] (each expert's gate rows, then its up rows) and w2
[num_experts, hidden, inter]. Tensor parallelism splits every expert's intermediate dimension
like the dense MLP: a rank holds the same slice of gate, up (columns) and down (rows) of each
expert, so its output is a partial sum that the next norm (or an all-reduce) completes. The
router is replicated: every rank sees the same reduced input and so routes identically.

Expert parallelism (TensorParallel.expert_parallel) places whole experts instead: rank r holds
experts [r * E / tp, (r + 1) * E / tp) at full width, computes only the pairs routed to them
(the others' ids become E / tp, a stand-in the kernels skip) and the same all-reduce sums the
ranks' partial outputs. Attention stays tensor-parallel.

Checkpoints name each expert's projections separately (model.layers.N.mlp.experts.E.gate_proj.weight);
the weight loaders here take one such tensor (shard id (E, 0 | 1) for gate | up, E for down) or
one packed [num_experts, ...] tensor (shard id None, as transformers 5 holds them in memory);
with expert parallelism a rank keeps only its own experts' tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.expert_counts import ExpertCounter, add_counts
from engine.layers.fused import UsesFusedKernels
from engine.layers.linear import ShardId, check_shape
from engine.layers.parallel import TensorParallel
from kernels.moe_reference import grouped_moe, route, route_topk_first


class MoEExperts(nn.Module):
    """num_experts SwiGLU experts of width `intermediate`: this rank's slice of each, or with expert
    parallelism num_local whole experts from first_expert on."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, tp: TensorParallel):
        super().__init__()
        self.num_experts, self.hidden, self.intermediate, self.tp = num_experts, hidden, intermediate, tp
        if tp.expert_parallel:
            if num_experts % tp.size:
                raise ValueError(f"expert_parallel: num_experts={num_experts} must be divisible by "
                                 f"tensor_parallel_size={tp.size}")
            self.num_local, self.per = num_experts // tp.size, intermediate
            self.first_expert, self.first_col = tp.rank * self.num_local, 0
        else:
            self.num_local, self.per = num_experts, tp.split(intermediate, "moe_intermediate_size")
            self.first_expert, self.first_col = 0, tp.rank * self.per
        self.gate_up_proj = nn.Parameter(torch.empty(self.num_local, 2 * self.per, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(self.num_local, hidden, self.per), requires_grad=False)
        self.gate_up_proj.weight_loader = self.load_gate_up
        self.down_proj.weight_loader = self.load_down

    @property
    def is_partial(self) -> bool:
        """Whether this rank holds only some of the experts (expert parallelism)."""
        return self.num_local < self.num_experts

    def local_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """The model's expert ids [T, k] -> this rank's (0 .. num_local - 1), num_local for another rank's."""
        shifted = ids - self.first_expert
        mine = (shifted >= 0) & (shifted < self.num_local)
        return torch.where(mine, shifted, torch.full_like(shifted, self.num_local))

    def _local(self, shard_id: ShardId) -> int | None:
        """The held index of the shard's expert, None where another rank holds it."""
        expert = shard_id[0] if isinstance(shard_id, tuple) else shard_id
        if not isinstance(expert, int) or not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert!r} is not one of the model's {self.num_experts} experts")
        local = expert - self.first_expert
        return local if 0 <= local < self.num_local else None

    def _held(self, packed: torch.Tensor) -> torch.Tensor:
        return packed[self.first_expert:self.first_expert + self.num_local]

    def load_gate_up(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        per, first = self.per, self.first_col
        if shard_id is None:  # packed: [num_experts, 2 * inter, hidden], gate rows then up rows
            check_shape(param, (self.num_experts, 2 * self.intermediate, self.hidden), loaded)
            held = self._held(loaded)
            param.data[:, :per].copy_(held[:, first:first + per])
            param.data[:, per:].copy_(held[:, self.intermediate + first:self.intermediate + first + per])
            return
        local, half = self._local(shard_id), shard_id[1] if isinstance(shard_id, tuple) else None
        if half not in (0, 1):
            raise ValueError(f"shard_id={shard_id!r}: expected (expert, 0) for gate or (expert, 1) for up")
        check_shape(param, (self.intermediate, self.hidden), loaded)
        if local is not None:
            param.data[local, half * per:(half + 1) * per].copy_(loaded[first:first + per])

    def load_down(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        per, first = self.per, self.first_col
        if shard_id is None:  # packed: [num_experts, hidden, inter]
            check_shape(param, (self.num_experts, self.hidden, self.intermediate), loaded)
            param.data.copy_(self._held(loaded)[:, :, first:first + per])
            return
        local = self._local(shard_id)
        check_shape(param, (self.hidden, self.intermediate), loaded)
        if local is not None:
            param.data[local].copy_(loaded[:, first:first + per])


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
        if self.experts.is_partial:
            out = self._own_experts(x, logits, record)
        elif fused is not None and fused.fused_moe is not None and fused.applies(x):
            # softmax, top-k, renormalisation and the alignment in one kernel (kernels.moe_route)
            out = fused.fused_moe(x, logits, w13, w2, self.top_k, self.renormalize, record=record,
                                  summed=not self.sum_in_norm)
        else:
            weights, ids = route(logits, self.top_k, self.renormalize)  # [T, k] each
            if record is not None:
                add_counts(record, ids)
            out = grouped_moe(x, w13, w2, weights, ids)
        return self.tp.reduce(out) if self.reduce_output else out

    def _own_experts(self, x: torch.Tensor, logits: torch.Tensor,
                     record: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Expert parallelism: the contributions of this rank's experts, [T, hidden]. Every rank
        routes the same tokens alike, so each records the whole layer's counts."""
        experts, fused = self.experts, self.fused_kernels
        w13, w2 = experts.gate_up_proj, experts.down_proj
        on_fused = fused is not None and fused.fused_moe_ids is not None and fused.applies(x)
        # the fused router's order (top-k of the logits, then softmax), float32 weights, on the fused path
        weights, ids = (route_topk_first if on_fused else route)(logits, self.top_k, self.renormalize)
        if record is not None:
            add_counts(record, ids)
        local = experts.local_ids(ids)
        if on_fused:
            return fused.fused_moe_ids(x, w13, w2, weights, local, table_experts=experts.num_experts)
        return grouped_moe(x, w13, w2, weights, local)


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
