"""Top-k and top-p as one number per row: the smallest logit that survives both filters.

A row keeps every token whose logit is >= its cutoff (rows without a filter get -inf), so the
filters are applied by one comparison inside the sampling pass and never change the values that
survive: a request's draw is the same whether or not its neighbours are filtered.

Semantics (Hugging Face's order): top-k first (ties with the k-th logit are kept), then top-p on
the renormalised remainder at the request's temperature: a token is kept while the probability
mass of the tokens ranked above it is below p, so the most likely token always survives.

Rows are split once per batch composition into two groups: those with a small k (<= TOPK_LIMIT)
look only at their group's largest k candidates (torch.topk, no full sort); the others (top-p
without top-k, or a large k) sort the whole vocabulary. The top-p softmax and cumsum run only in
a group that has a row with p < 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Largest k served by torch.topk; beyond it a full sort is as fast and simpler.
TOPK_LIMIT = 1024
# Stands for "no top-p" in a group that mixes rows with and without it (mass never reaches 2).
NO_TOP_P = 2.0


@dataclass
class FilterPlan:
    """One group of filtered rows, as host arrays (built once per batch composition)."""

    rows: np.ndarray  # [F] int64, rows of the batch
    top_k: np.ndarray  # [F] int64, effective k in [1, vocab]
    top_p: np.ndarray | None  # [F] float32 (NO_TOP_P: off); None when no row uses top-p
    inv_temp: np.ndarray  # [F] float32
    width: int  # candidates per row: the group's largest k (topk) or the vocabulary (sort)
    all_rows: bool  # the group is the whole batch: no gather needed


@dataclass
class FilterGroup:
    """A FilterPlan's arrays on the device."""

    rows: torch.Tensor | None  # [F] int64; None when the group is the whole batch
    top_k: torch.Tensor  # [F] int64
    top_p: torch.Tensor | None  # [F] float32
    inv_temp: torch.Tensor  # [F] float32
    width: int


def plan_filters(top_k: np.ndarray, top_p: np.ndarray, inv_temp: np.ndarray, sampled: np.ndarray,
                 vocab: int) -> list[FilterPlan]:
    """top_k [N] (-1: off), top_p [N], inv_temp [N], sampled [N] bool (not greedy) -> groups."""
    n = len(top_k)
    k = np.where((top_k == -1) | (top_k > vocab), vocab, top_k)
    filtered = sampled & ((k < vocab) | (top_p < 1.0))
    small = filtered & (k <= min(TOPK_LIMIT, vocab - 1))
    plans = []
    for members, by_topk in ((small, True), (filtered & ~small, False)):
        rows = np.flatnonzero(members)
        if not len(rows):
            continue
        p = top_p[rows]
        plans.append(FilterPlan(
            rows=rows.astype(np.int64), top_k=k[rows].astype(np.int64),
            top_p=np.where(p < 1.0, p, NO_TOP_P).astype(np.float32) if (p < 1.0).any() else None,
            inv_temp=inv_temp[rows].astype(np.float32),
            width=int(k[rows].max()) if by_topk else vocab, all_rows=len(rows) == n,
        ))
    return plans


def _group_cutoffs(logits: torch.Tensor, group: FilterGroup) -> torch.Tensor:  # [F] float32
    sub = logits if group.rows is None else logits.index_select(0, group.rows)  # [F, vocab]
    if group.width < sub.shape[1]:
        vals = sub.topk(group.width, dim=-1).values  # [F, width], descending
    else:
        vals = sub.sort(dim=-1, descending=True).values
    if group.top_p is None:
        return vals.gather(1, (group.top_k - 1)[:, None]).squeeze(1)
    ranks = torch.arange(vals.shape[1], device=vals.device)
    beyond_k = ranks[None, :] >= group.top_k[:, None]  # [F, width]
    probs = (vals * group.inv_temp[:, None]).masked_fill_(beyond_k, float("-inf")).softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1).sub_(probs)
    drop = beyond_k | (mass_above >= group.top_p[:, None])
    # keep the ranks before the first drop (rank 0 is never dropped: its mass above is 0 < p)
    first_drop = drop.to(torch.uint8).argmax(dim=-1)
    kept = torch.where(drop.any(dim=-1), first_drop, vals.shape[1])
    return vals.gather(1, (kept - 1)[:, None]).squeeze(1)


def cutoffs(logits: torch.Tensor, groups: list[FilterGroup]) -> torch.Tensor | None:
    """logits [N, vocab] -> [N] float32 cutoff per row (-inf: unfiltered), or None if no group."""
    if not groups:
        return None
    if len(groups) == 1 and groups[0].rows is None:
        return _group_cutoffs(logits, groups[0])
    out = torch.full((logits.shape[0],), float("-inf"), dtype=torch.float32, device=logits.device)
    for group in groups:
        out.index_copy_(0, group.rows, _group_cutoffs(logits, group))
    return out
