"""The dense decoder every architecture shares, over a paged KV cache: pre-norm layers, RoPE,
grouped-query attention, SwiGLU MLP.

What sets an architecture apart is read from its ModelShape (engine.core.model_shapes): the q/k
norm, which projections carry a bias, a tied LM head. Each architecture is a subclass of
DecoderForCausalLM in a module of its own (qwen3.py, qwen2.py, llama.py), named by
engine.core.architectures.ARCHITECTURES. Inputs are flat: all scheduled tokens of all sequences in
one [num_tokens] batch, with their absolute positions; the attention metadata says which
sequence each token belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.core.model_shapes import ModelShape
from engine.layers.activation import SiluAndMul
from engine.layers.attention import PagedAttention
from engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.fused import UsesFusedKernels, set_fused_kernels
from engine.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    ShardId,
    default_weight_loader,
)
from engine.layers.norm import RMSNorm
from engine.layers.parallel import TensorParallel
from engine.layers.rotary import RotaryEmbedding, apply_rotary
from engine.models.materialize import materialize_parameters

KVCache = tuple[torch.Tensor, torch.Tensor]


class DecoderAttention(nn.Module, UsesFusedKernels):
    def __init__(self, shape: ModelShape, backend: AttentionBackend, tp: TensorParallel):
        super().__init__()
        self.fused_kernels = None  # engine.layers.fused: q/k norm + rotary in one kernel
        self.eps = shape.rms_norm_eps
        d = shape.head_dim
        self.qkv_proj = QKVParallelLinear(shape.hidden_size, d, shape.num_heads, shape.num_kv_heads, shape.qkv_bias, tp)
        self.num_heads, self.num_kv_heads, self.head_dim = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, d
        self.o_proj = RowParallelLinear(shape.num_heads * d, shape.hidden_size, shape.o_bias, tp, not tp.defers_reduce)
        self.q_norm = RMSNorm(d, shape.rms_norm_eps) if shape.qk_norm else None
        self.k_norm = RMSNorm(d, shape.rms_norm_eps) if shape.qk_norm else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, d, d**-0.5, backend)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ):
        t, d = x.shape[0], self.head_dim
        q, k, v = self.qkv_proj(x).split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q = q.view(t, self.num_heads, d)  # [T, heads, head_dim]
        k = k.view(t, self.num_kv_heads, d)  # [T, kv_heads, head_dim]
        v = v.view(t, self.num_kv_heads, d)
        fused = self.fused_kernels
        if fused is not None and fused.applies(q):
            # norm + rotation of q and k in place, in the qkv buffer (the views stay strided), and
            # k and v stored into the paged cache by the same kernel
            norms = (self.q_norm.weight, self.k_norm.weight) if self.q_norm is not None else (None, None)
            fused.qk_norm_rope_(q, k, cos, sin, *norms, self.eps, store=(v, *kv_cache, meta.slot_mapping))
            k = v = None
        else:
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta))  # [T, hidden], partial if tp.defers_reduce


class DecoderMLP(nn.Module):
    def __init__(self, shape: ModelShape, tp: TensorParallel):
        super().__init__()
        i = shape.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(shape.hidden_size, [i, i], shape.mlp_bias, tp)
        self.down_proj = RowParallelLinear(i, shape.hidden_size, shape.mlp_bias, tp, not tp.defers_reduce)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, shape: ModelShape, backend: AttentionBackend, tp: TensorParallel, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.self_attn = DecoderAttention(shape, backend, tp)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.mlp = mlp  # DecoderMLP, or a mixture of experts (engine.models.qwen3_moe)
        # with tensor parallelism the projections' partial sums are reduced by the norm after them
        self.partial_of = tp if tp.defers_reduce else None

    def forward(self, x, residual, cos, sin, kv_cache: KVCache, meta: AttentionMetadata):
        # residual carries the un-normalised stream; the add is fused into the next norm. x is the
        # embedding (reduced) in the first layer, the previous MLP's output after it.
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual, self.partial_of)
        x = self.self_attn(x, cos, sin, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual, self.partial_of)
        return self.mlp(x), residual


MLPFactory = Callable[[ModelShape, int, TensorParallel], nn.Module]


class DecoderModel(nn.Module):
    def __init__(self, shape: ModelShape, backend: AttentionBackend, tp: TensorParallel, make_mlp: MLPFactory):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(shape.vocab_size, shape.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(shape, backend, tp, make_mlp(shape, i, tp))
                                    for i in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """The shared model; build an architecture's subclass through engine.models.build_model."""

    # HF projection name -> (our fused module, shard id) for the weight loader
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(
        self,
        config: ModelShape | Mapping[str, Any] | Any,
        attention_backend: AttentionBackend,
        tp: TensorParallel | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        """config: the model's shape, or the config.json it is read from (a dict or a transformers
        PretrainedConfig). Parameters are allocated on `device` in `dtype` but left uninitialised
        (see loader)."""
        super().__init__()
        self.shape = shape = config if isinstance(config, ModelShape) else ModelShape.from_hf_config(config)
        if shape.architecture.hf_class != type(self).__name__:
            raise ValueError(f"{type(self).__name__} cannot serve model_type={shape.model_type!r} "
                             f"(that is {shape.architecture.hf_class}); build it with engine.models.build_model")
        self.tp = tp = tp or TensorParallel()
        self.weights_load_s: float | None = None  # the loader's time to fill the weights (engine.loader)
        with torch.device("meta"):
            self.model = DecoderModel(shape, attention_backend, tp, self.build_mlp)
            self.lm_head = ParallelLMHead(shape.vocab_size, shape.hidden_size, tp)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        materialize_parameters(self, device, dtype)
        for p in self.parameters():
            if not hasattr(p, "weight_loader"):
                p.weight_loader = default_weight_loader
        self.rotary_emb = RotaryEmbedding(shape.head_dim, shape.max_position_embeddings, shape.rope_theta, device)
        first = self.model.layers[0].self_attn
        self.num_layers, self.num_kv_heads, self.head_dim = shape.num_layers, first.num_kv_heads, shape.head_dim

    def build_mlp(self, shape: ModelShape, layer: int, tp: TensorParallel) -> nn.Module:
        """The feed-forward block of layer `layer`; an architecture with experts overrides this."""
        return DecoderMLP(shape, tp)

    def checkpoint_target(self, hf_name: str) -> tuple[str, ShardId]:
        """Hugging Face tensor name -> (the parameter it fills, shard id for that parameter's loader)."""
        parts = hf_name.split(".")
        for i, part in enumerate(parts):
            if part in self.packed_modules_mapping:
                fused, shard_id = self.packed_modules_mapping[part]
                return ".".join(parts[:i] + [fused] + parts[i + 1 :]), shard_id
        return hf_name, None

    def checkpoint_names(self, param_name: str) -> list[str]:
        """Inverse of checkpoint_target: the Hugging Face tensors that together fill one parameter."""
        names = [
            param_name.replace(f".{fused}.", f".{hf}.")
            for hf, (fused, _) in self.packed_modules_mapping.items()
            if f".{fused}." in param_name
        ]
        return names or [param_name]

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64, absolute position of each token in its sequence
        kv_caches: list[KVCache],  # per layer (k_cache, v_cache), [num_blocks, block_size, kv_heads, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Returns final-norm hidden states [T, hidden]; logits are computed separately."""
        cos, sin = self.rotary_emb(positions)  # [T, head_dim / 2] each
        x, residual = self.model.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, cos, sin, kv_cache, meta)
        x, _ = self.model.norm(x, residual, self.tp if self.tp.defers_reduce else None)
        return x

    def set_fused_kernels(self, mode: str, allow_cpu: bool = False) -> int:
        """Elementwise kernels of every layer: "off" (torch ops) or "triton" (fused, CUDA tensors
        only unless allow_cpu). Call before capturing CUDA graphs. Returns the fused layer count."""
        return set_fused_kernels(self, mode, self.lm_head.weight.device, allow_cpu)

    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """hidden [N, hidden] (only the rows to sample) -> [N, vocab] float32; with upcast=False
        in the model's dtype (the sampler reads those itself: a full-vocabulary pass saved)."""
        return self.lm_head.compute_logits(hidden, upcast)

    def make_kv_caches(self, num_blocks: int, block_size: int, dtype: torch.dtype | None = None) -> list[KVCache]:
        """Zeroed per-layer caches in the model's dtype and device, shaped for this rank."""
        ref = self.lm_head.weight
        dims = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        make = lambda: torch.zeros(dims, dtype=dtype or ref.dtype, device=ref.device)  # noqa: E731
        return [(make(), make()) for _ in range(self.num_layers)]
