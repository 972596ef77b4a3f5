"""Helpers for the fused-kernel wiring tests of the model: a ragged prefill then a decode step on
fresh paged caches, stand-in kernels built from the float32 references (no Triton needed), and
call counting, so a test can tell which path each layer took."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields

import numpy as np
import torch

from engine.attention import make_metadata, slot_mapping_for
from engine.attention.torch_backend import store_kv
from engine.layers.fused import FusedKernels, UsesFusedKernels
from kernels.elementwise_reference import add_rms_norm_ref, qk_norm_rope_ref, rms_norm_ref, silu_and_mul_ref

BLOCK_SIZE = 4
KERNEL_NAMES = ("rms_norm", "add_rms_norm", "silu_and_mul", "qk_norm_rope_")


def _add_rms_norm(x, residual, weight, eps):
    out, summed = add_rms_norm_ref(x, residual, weight, eps)
    return out.to(x.dtype), summed.to(x.dtype)


def _qk_norm_rope_(q, k, cos, sin, q_weight=None, k_weight=None, eps=1e-6, store=None):
    rq, rk = qk_norm_rope_ref(q, k, cos, sin, q_weight, k_weight, eps)
    q.copy_(rq)
    k.copy_(rk)
    if store is not None:  # (v, k_cache, v_cache, slot_mapping), as kernels.rotary stores them
        store_kv(k, *store)
    return q, k


def reference_kernels() -> FusedKernels:
    """Torch stand-ins with the fused kernels' signatures and in-place behaviour, for CPU tensors."""
    return FusedKernels(
        rms_norm=lambda x, w, eps: rms_norm_ref(x, w, eps).to(x.dtype),
        add_rms_norm=_add_rms_norm,
        silu_and_mul=lambda x: silu_and_mul_ref(x).to(x.dtype),
        qk_norm_rope_=_qk_norm_rope_,
        allow_cpu=True,
    )


def count_calls(model: torch.nn.Module) -> Counter:
    """Wrap the kernels the model's layers hold so that each call is counted (by kernel name)."""
    calls: Counter = Counter()
    layers = [m for m in model.modules() if isinstance(m, UsesFusedKernels) and m.fused_kernels is not None]
    assert layers, "no layer holds fused kernels"
    base = layers[0].fused_kernels

    def counted(name):
        fn = getattr(base, name)

        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    wrapped = FusedKernels(**{f.name: counted(f.name) if f.name in KERNEL_NAMES else getattr(base, f.name)
                              for f in fields(FusedKernels)})
    for layer in layers:
        layer.fused_kernels = wrapped
    return calls


def prefill_then_decode(model, device: str, seed: int = 0, block_size: int = BLOCK_SIZE,
                        lens: tuple[int, ...] = (5, 11, 3), vocab_limit: int = 500) -> list[torch.Tensor]:
    """Logits [tokens, vocab] of a prefill of ragged sequences (several blocks, partial last
    ones), then [num_seqs, vocab] of one decode token each, on fresh zeroed caches."""
    caches = model.make_kv_caches(64, block_size)
    rng = np.random.default_rng(seed)
    blocks = rng.permutation(64).tolist()
    tables = [[blocks.pop() for _ in range(-(-(n + 1) // block_size))] for n in lens]
    out = []
    with torch.inference_mode():
        for step in ("prefill", "decode"):
            starts = [0] * len(lens) if step == "prefill" else list(lens)
            ends = list(lens) if step == "prefill" else [n + 1 for n in lens]
            ids = np.concatenate([rng.integers(0, vocab_limit, e - s) for s, e in zip(starts, ends)])
            positions = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)])
            slots = np.concatenate([slot_mapping_for(t, s, e, block_size) for t, s, e in zip(tables, starts, ends)])
            meta = make_metadata([e - s for s, e in zip(starts, ends)], ends, tables, slots, device=device)
            hidden = model(torch.as_tensor(ids, device=device), torch.as_tensor(positions, device=device), caches, meta)
            out.append(model.compute_logits(hidden))
    return out
