"""Mixture-of-experts in plain torch: the router, the grouped expert computation the engine runs on
CPU, and a float32 per-token reference that the Triton kernel (kernels.fused_moe) and the grouped
path are tested against.

Expert weights are stacked (engine.layers.moe):
    w13 [num_experts, 2 * inter, hidden]   gate rows first, then up rows (SwiGLU)
    w2  [num_experts, hidden, inter]
An expert maps x to w2 @ (silu(w13_gate @ x) * (w13_up @ x)); a token's output is the sum over
its top-k experts, each scaled by the token's router weight for that expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k] in the logits' dtype, expert ids [T, k] int64).

    As transformers' Qwen3MoeTopKRouter: softmax in float32, top-k, optionally rescaled so the
    chosen k weights sum to 1, then cast back."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def route_topk_first(router_logits: torch.Tensor, top_k: int, renormalize: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """route() in the order the Triton router (kernels.moe_route) computes it, in float32: the top-k
    of the logits, then their softmax (renormalize) or their share of the full softmax. Weights
    float32, ids int64. Equal to route() because exp is increasing: the top-k of the logits are
    the top-k of the probabilities, and p_j / sum_k p = exp(l_j) / sum_k exp(l)."""
    logits = router_logits.float()
    top, ids = torch.topk(logits, top_k, dim=-1)
    if renormalize:
        return torch.softmax(top, dim=-1), ids
    shift = logits.max(dim=-1, keepdim=True).values
    return torch.exp(top - shift) / torch.exp(logits - shift).sum(dim=-1, keepdim=True), ids


def grouped_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
    """x [T, hidden] -> [T, hidden]: the (token, expert) pairs sorted by expert, one pair of
    matmuls per expert over all of its tokens, then each token's top-k outputs weighted and summed.

    Reads the per-expert counts on the host, so it is the CPU path (and eager CUDA without Triton),
    never captured in a CUDA graph. An id equal to w13.shape[0] is a pair of an expert another
    rank holds (expert parallelism, engine.layers.moe): it adds nothing here."""
    t, k = topk_ids.shape
    inter = w2.shape[2]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pair indices (token * k + slot), grouped by expert
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    rows = x[order // k]  # [T * k, hidden], one row per pair in expert order
    out = torch.empty_like(rows)
    start = 0
    for expert, n in enumerate(counts):
        seg, start = slice(start, start + n), start + n
        if n == 0:
            continue
        if expert >= w13.shape[0]:  # another rank's experts
            out[seg] = 0
            continue
        gate_up = rows[seg] @ w13[expert].t()  # [n, 2 * inter]
        out[seg] = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[expert].t()
    per_pair = torch.empty_like(out)
    per_pair[order] = out  # back to (token, slot) order
    weighted = per_pair.view(t, k, -1) * topk_weights.to(x.dtype).unsqueeze(-1)
    return weighted.sum(dim=1)


def fused_moe_ref(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """The float32 ground truth: every (token, slot) pair computed on its own, [T, hidden] float32."""
    x, w13, w2, weights = x.float(), w13.float(), w2.float(), topk_weights.float()
    inter = w2.shape[2]
    out = torch.zeros_like(x)
    for token in range(x.shape[0]):
        for slot in range(topk_ids.shape[1]):
            e = int(topk_ids[token, slot])
            gate_up = w13[e] @ x[token]
            h = F.silu(gate_up[:inter]) * gate_up[inter:]
            out[token] += weights[token, slot] * (w2[e] @ h)
    return out
