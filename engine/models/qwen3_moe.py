"""Qwen3-MoE (model_type "qwen3_moe"): Qwen3's attention (q/k norm) with a sparse mixture of
SwiGLU experts in place of the dense MLP on the layers ModelShape.is_moe_layer names; the others
keep the dense MLP of width intermediate_size.

Published checkpoints name every expert's projections (model.layers.N.mlp.experts.E.gate_proj.weight);
they are packed at load time into the stacked tensors of engine.layers.moe.MoEExperts. Checkpoints
that already hold the stacked form (mlp.experts.gate_up_proj [E, 2 * inter, hidden] and
mlp.experts.down_proj [E, hidden, inter], transformers 5's in-memory layout) load as they are.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from engine.attention.metadata import AttentionMetadata
from engine.core.model_shapes import ModelShape
from engine.expert_counts import ExpertCounter
from engine.layers.linear import ShardId
from engine.layers.moe import SparseMoE
from engine.layers.parallel import TensorParallel
from engine.models.decoder import DecoderForCausalLM, DecoderMLP, KVCache

_EXPERT_TENSOR = re.compile(r"^(?P<experts>.+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    # engine.expert_counts: routed tokens per expert, when the engine records them
    expert_counter: ExpertCounter | None = None

    def build_mlp(self, shape: ModelShape, layer: int, tp: TensorParallel) -> nn.Module:
        if not shape.is_moe_layer(layer):
            return DecoderMLP(shape, tp)
        # every MoE output feeds the next layer's (or the final) RMSNorm beside the residual,
        # which can take the top-k sum (SparseMoE.sum_in_norm) where no all-reduce comes first
        return SparseMoE(shape.num_experts, shape.num_experts_per_tok, shape.hidden_size,
                         shape.moe_intermediate_size, shape.norm_topk_prob, tp, reduce_output=not tp.defers_reduce,
                         sum_in_norm=tp.size == 1)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        if self.expert_counter is not None:
            # real tokens have a cache slot; a CUDA graph's padding rows have -1. The graphs keep
            # this tensor's address, and replays read the slots of the step they serve.
            self.expert_counter.valid = meta.slot_mapping
        return super().forward(input_ids, positions, kv_caches, meta)

    def checkpoint_target(self, hf_name: str) -> tuple[str, ShardId]:
        match = _EXPERT_TENSOR.match(hf_name)
        if match is None:
            return super().checkpoint_target(hf_name)
        expert, proj = int(match["expert"]), match["proj"]
        if proj == "down":
            return f"{match['experts']}.down_proj", expert
        return f"{match['experts']}.gate_up_proj", (expert, 0 if proj == "gate" else 1)

    def checkpoint_names(self, param_name: str) -> list[str]:
        experts, _, packed = param_name.rpartition(".")
        if not experts.endswith(".mlp.experts"):
            return super().checkpoint_names(param_name)
        projs = ("gate", "up") if packed == "gate_up_proj" else ("down",)
        return [f"{experts}.{e}.{p}_proj.weight" for e in range(self.shape.num_experts) for p in projs]
