"""Linear layers that hold one tensor-parallel shard of a Hugging Face projection.

Column-parallel layers split the output features across ranks (each rank computes a slice of
the output, no communication); row-parallel layers split the input features and sum their
partial outputs with an all-reduce. The fused layers pack several HF projections (q/k/v,
gate/up) into one matmul; each packed piece is a "shard" that the loader fills by shard_id.

Parameters are created uninitialised: the loader overwrites every one of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.core.kv_heads import kv_heads_held
from engine.layers.parallel import TensorParallel

ShardId = str | int | tuple[int, int] | None  # tuple: (expert, gate 0 | up 1) of stacked experts


def check_shape(param: torch.Tensor, expected: tuple[int, ...], loaded: torch.Tensor) -> None:
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(
            f"shape mismatch: checkpoint has {tuple(loaded.shape)}, model expects {tuple(expected)}"
            f" (held shard {tuple(param.shape)})"
        )


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
    """Replicated parameters (norms): same tensor on every rank."""
    check_shape(param, tuple(param.shape), loaded)
    param.data.copy_(loaded)


def _parameter(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class _ColumnParallel(nn.Module):
    """Output rows are the concatenation of shards; each shard is split across ranks.

    shards: shard_id -> (rows in the checkpoint tensor, first row this rank takes,
    rows this rank takes, offset of those rows in the fused parameter).
    """

    def __init__(self, input_size: int, shards: dict[ShardId, tuple[int, int, int, int]], bias: bool,
                 tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.shards = shards
        out_rows = sum(rows for _, _, rows, _ in shards.values())
        self.weight = _parameter(out_rows, input_size)
        self.weight.weight_loader = self.weight_loader
        self.bias = _parameter(out_rows) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        if shard_id not in self.shards:
            raise ValueError(f"shard_id={shard_id!r} is unknown; expected one of {list(self.shards)}")
        full_rows, src, rows, dst = self.shards[shard_id]
        check_shape(param, (full_rows, *param.shape[1:]), loaded)
        param.data.narrow(0, dst, rows).copy_(loaded.narrow(0, src, rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(_ColumnParallel):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp: TensorParallel | None = None):
        tp = tp or TensorParallel()
        per = tp.split(output_size, "output_size")
        super().__init__(input_size, {None: (output_size, tp.rank * per, per, 0)}, bias, tp)


class MergedColumnParallelLinear(_ColumnParallel):
    """Several projections of the same input stacked on the output dim (gate/up: shard 0, 1)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False, tp: TensorParallel | None = None):
        tp = tp or TensorParallel()
        shards, offset = {}, 0
        for i, size in enumerate(output_sizes):
            per = tp.split(size, f"output_sizes[{i}]")
            shards[i] = (size, tp.rank * per, per, offset)
            offset += per
        super().__init__(input_size, shards, bias, tp)


class QKVParallelLinear(_ColumnParallel):
    """q, k and v projections fused (shard ids "q", "k", "v"), split by attention head.

    With more ranks than kv heads, each kv head is replicated on tp_size / num_kv_heads ranks.
    """

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool = False,
        tp: TensorParallel | None = None,
    ):
        tp = tp or TensorParallel()
        heads = tp.split(num_heads, "num_attention_heads")
        if num_kv_heads >= tp.size:
            tp.split(num_kv_heads, "num_key_value_heads")
        elif tp.size % num_kv_heads:
            raise ValueError(f"tp_size={tp.size} must be a multiple of num_key_value_heads={num_kv_heads}")
        held = kv_heads_held(num_kv_heads, tp.size, tp.rank)  # the KV link regroups heads by this rule
        kv_heads, kv_first = len(held), held.start
        q, kv = heads * head_dim, kv_heads * head_dim
        shards = {
            "q": (num_heads * head_dim, tp.rank * q, q, 0),
            "k": (num_kv_heads * head_dim, kv_first * head_dim, kv, q),
            "v": (num_kv_heads * head_dim, kv_first * head_dim, kv, q + kv),
        }
        super().__init__(hidden_size, shards, bias, tp)
        self.num_heads, self.num_kv_heads = heads, kv_heads  # held by this rank


class RowParallelLinear(nn.Module):
    """Input features split across ranks; partial outputs summed by tp.all_reduce, or, with
    reduce_output=False, returned as this rank's partial sum for the layer after to reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, tp: TensorParallel | None = None,
                 reduce_output: bool = True):
        super().__init__()
        self.tp = tp or TensorParallel()
        self.reduce_output = reduce_output
        self.input_size = input_size
        self.per = self.tp.split(input_size, "input_size")
        self.weight = _parameter(output_size, self.per)
        self.weight.weight_loader = self.weight_loader
        self.bias = _parameter(output_size) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = default_weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        check_shape(param, (param.shape[0], self.input_size), loaded)
        param.data.copy_(loaded.narrow(1, self.tp.rank * self.per, self.per))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The bias is added once, by rank 0, so the sum over ranks counts it once.
        bias = self.bias if self.tp.rank == 0 else None
        partial = F.linear(x, self.weight, bias)
        return self.tp.reduce(partial) if self.reduce_output else partial
