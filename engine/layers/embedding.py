"""Token embedding and LM head split by vocabulary rows across tensor-parallel ranks.

Each rank holds ceil(vocab / tp_size) rows; the last rank's tail past the real vocabulary is
zero padding. The embedding sums per-rank lookups (ids outside a rank's range contribute zeros);
the LM head gathers per-rank logits and cuts the padding off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import ShardId, check_shape
from engine.layers.parallel import TensorParallel


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TensorParallel | None = None):
        super().__init__()
        self.tp = tp or TensorParallel()
        self.num_embeddings = num_embeddings
        self.rows = -(-num_embeddings // self.tp.size)
        self.first = self.tp.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: ShardId = None) -> None:
        check_shape(param, (self.num_embeddings, param.shape[1]), loaded)
        n = max(0, min(self.rows, self.num_embeddings - self.first))
        param.data[:n].copy_(loaded.narrow(0, self.first, n))
        param.data[n:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # input_ids [T] -> [T, hidden]
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.first
        mine = (local >= 0) & (local < self.rows)
        out = F.embedding(local.clamp(0, self.rows - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        # hidden [N, hidden] -> logits [N, vocab]: float32, or the weights' dtype without upcast
        logits = self.tp.gather(F.linear(hidden, self.weight))[:, : self.num_embeddings]
        return logits.float() if upcast else logits

    @property
    def real_rows(self) -> int:
        """This rank's rows that are real vocabulary entries (the last rank's tail is padding)."""
        return max(0, min(self.rows, self.num_embeddings - self.first))

    def shard_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> this rank's logits [N, real_rows] in the weights' dtype: vocabulary
        entries first .. first + real_rows - 1, nothing gathered (engine.sharded_sampling)."""
        return F.linear(hidden, self.weight[: self.real_rows])
