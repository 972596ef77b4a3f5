"""The router's softmax, top-k and renormalisation in one Triton launch, which also counts the chosen
experts for the alignment (kernels.moe_align_triton) and, optionally, into a per-layer record.

Per token: the k largest router logits (the lowest expert id first among equal ones), and their
weights exp(l_j - max) / Z, where Z is the sum over the k chosen (renormalize, Qwen3-MoE's
norm_topk_prob) or over all experts. That is softmax, top-k, renormalise
(kernels.moe_reference.route, transformers' order) computed in another order: the softmax is
monotonic, so the top-k of the logits are those of the probabilities, and the renormalised
weights are p_j / sum_k p = exp(l_j) / sum_k exp(l) (kernels.moe_reference.route_topk_first
states it in torch; tests/kernels/test_moe_route_reference.py checks the two agree). Weights are
float32 (the down GEMM reads them in float32), ids int32.

Program c takes tokens [c * TOK, (c + 1) * TOK) with TOK = CHUNK // k: their pairs are chunk c
of the alignment, whose per-expert counts it writes to row c of the count table, and it fills
chunk c's slots of the sorted list with the padding value, as the alignment's count kernel does
(programs past the tokens only fill). With a record (a [E] int32 row of the engine's expert
counter, engine.expert_counts), it adds the counts of the tokens whose `valid` entry is >= 0
(the KV-cache slot: padding rows of a CUDA graph have -1), by atomic adds. No host sync: the
whole routing runs inside CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_align import tokens_per_program
from kernels.moe_align_triton import Aligned, align_buffers, scatter

__all__ = ["route_align", "tokens_per_program"]


# the token count and the list's length follow the step: not specialised (kernels.moe_align_triton)
@triton.jit(do_not_specialize=["num_tokens", "capacity"])
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, counts_ptr, sorted_ids_ptr, valid_ptr, record_ptr,
                  num_tokens, num_experts, capacity, stride_l,
                  TOP_K: tl.constexpr, K_PAD: tl.constexpr, TOK: tl.constexpr, TOK_PAD: tl.constexpr,
                  E_PAD: tl.constexpr, CHUNK_PAD: tl.constexpr, RENORMALIZE: tl.constexpr, RECORD: tl.constexpr):
    pid = tl.program_id(0)
    chunk = TOK * TOP_K
    local = tl.arange(0, CHUNK_PAD)
    slots = pid * chunk + local
    tl.store(sorted_ids_ptr + slots, tl.zeros((CHUNK_PAD,), dtype=tl.int32) + num_tokens * TOP_K,
             mask=(local < chunk) & (slots < capacity))
    toks = pid * TOK + tl.arange(0, TOK_PAD)
    tok_ok = (tl.arange(0, TOK_PAD) < TOK) & (toks < num_tokens)
    cols = tl.arange(0, E_PAD)
    row = tl.load(logits_ptr + toks[:, None].to(tl.int64) * stride_l + cols[None, :],
                  mask=tok_ok[:, None] & (cols < num_experts)[None, :], other=-float("inf")).to(tl.float32)
    top = tl.max(row, axis=1)
    top = tl.where(tok_ok, top, 0.0)  # padding rows: all -inf, kept finite
    if not RENORMALIZE:
        z = tl.sum(tl.exp(row - top[:, None]), axis=1)
    k_slots = tl.arange(0, K_PAD)
    chosen = tl.zeros((TOK_PAD, K_PAD), dtype=tl.int32)
    probs = tl.zeros((TOK_PAD, K_PAD), dtype=tl.float32)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    if RECORD:
        valid = tok_ok & (tl.load(valid_ptr + toks, mask=tok_ok, other=-1) >= 0)
        recorded = tl.zeros((E_PAD,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(row, axis=1)
        idx = tl.min(tl.where(row == best[:, None], cols[None, :], E_PAD), axis=1)
        chosen = tl.where(k_slots[None, :] == j, idx[:, None], chosen)
        probs = tl.where(k_slots[None, :] == j, tl.exp(best - top)[:, None], probs)
        hit = cols[None, :] == idx[:, None]
        counts += tl.sum((hit & tok_ok[:, None]).to(tl.int32), axis=0)
        if RECORD:
            recorded += tl.sum((hit & valid[:, None]).to(tl.int32), axis=0)
        row = tl.where(hit, -float("inf"), row)
    if RENORMALIZE:
        z = tl.sum(probs, axis=1)
    z = tl.where(tok_ok, z, 1.0)
    out = toks[:, None] * TOP_K + k_slots[None, :]
    out_ok = tok_ok[:, None] & (k_slots < TOP_K)[None, :]
    tl.store(ids_ptr + out, chosen, mask=out_ok)
    tl.store(weights_ptr + out, probs / z[:, None], mask=out_ok)
    tl.store(counts_ptr + pid * E_PAD + cols, counts)
    if RECORD:
        tl.atomic_add(record_ptr + cols, recorded, mask=(cols < num_experts) & (recorded > 0))


def route_align(router_logits: torch.Tensor, top_k: int, renormalize: bool, block_m: int,
                record: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, Aligned]:
    """router_logits [T, E] (last dimension contiguous) -> (weights [T, k] float32, ids [T, k] int32,
    the alignment kernels.moe_align_triton.moe_align_triton would give for ids). record: (counter
    row [E] int32, valid [T], a token counted where valid >= 0), or None."""
    t, num_experts = router_logits.shape
    if router_logits.stride(1) != 1:
        raise ValueError("route_align: router_logits must be contiguous in its last dimension")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"route_align: top_k={top_k} must be in [1, num_experts={num_experts}]")
    device = router_logits.device
    tok = tokens_per_program(top_k)
    chunk = tok * top_k
    weights = torch.empty((t, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=device)
    counts, sorted_ids = align_buffers(t * top_k, num_experts, block_m, chunk, device)
    if record is not None:
        row, valid = record
        if row.shape != (num_experts,) or row.dtype != torch.int32 or valid.shape != (t,):
            raise ValueError(f"route_align: record must be ([{num_experts}] int32, [{t}]), got "
                             f"({tuple(row.shape)} {row.dtype}, {tuple(valid.shape)})")
    else:
        row = valid = counts  # never read
    _route_kernel[(counts.shape[0],)](
        router_logits, weights, ids, counts, sorted_ids, valid, row,
        t, num_experts, sorted_ids.numel(), router_logits.stride(0),
        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), TOK=tok, TOK_PAD=triton.next_power_of_2(tok),
        E_PAD=counts.shape[1], CHUNK_PAD=triton.next_power_of_2(chunk), RENORMALIZE=renormalize,
        RECORD=record is not None, num_warps=4,
    )
    return weights, ids, scatter(ids.view(-1), counts, sorted_ids, num_experts, block_m, chunk)
