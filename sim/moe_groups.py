"""Routing groups: how the members of a group of sequences over one prefix route alike.

sim.features.routing_sequences groups a step's sequences that start with the same tokens;
sim.moe_locality.SequenceRouting prices each group from its member with the most new tokens, routing
as a sequence of its own, and the rest here. Each fresh draw of a later member (its token j draws
fresh with probability f_j = 1 / (1 + locality j), as any sequence's) is fresh for the group with
probability shared_fresh = q, else it reuses a top-k the group drew and touches nothing new. So a
later token makes a fresh draw for the group with probability a_t = q f_j, independently.

- Without a cap each such draw is a new top-k at the skew, and the later members leave expert e
  untouched with probability prod_t (1 - a_t pi_e) (exact; q = 1: the members route apart).
- With shared_cap = M (an integer) the group has M routings of its own (top-k sets drawn at the
  skew), and each fresh draw takes one of them at random, so the later members bring at most M.
  Expert e lies in r of the M routings, r ~ Binomial(M, pi_e), and stays untouched when no draw
  takes one of those r: probability sum_r P(r) prod_t (1 - a_t r / M) (exact). Larger M touches
  more, and M -> infinity is the uncapped product.

pi_e: the probability that a top-k drawn at the skew includes expert e (sim.moe.inclusion_probabilities).
Why two figures: on Qwen3-30B-A3B with random weights groups of 4-6 decodes over one prefix made
about 1 + 0.06 per later member fresh draws, and groups of 128 and 256 no more than about five
(sim.moe_shared_prefix fits both; docs/moe-pricing.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

MAX_CAP = 256  # the largest cap taken: past it a group's routings are as good as unbounded (they cover every expert)


def check_shared(fresh: float | None, cap: int | None) -> None:
    """ValueError naming the field: shared_fresh a number in (0, 1] or None; shared_cap an int in
    [1, MAX_CAP] or None, and only with a shared_fresh."""
    if fresh is not None and (isinstance(fresh, bool) or not isinstance(fresh, (int, float))
                              or not 0.0 < fresh <= 1.0):
        raise ValueError(f"moe_routing_shared_fresh must be null or a number in (0, 1] (1: sequences over one prefix "
                         f"route apart), got {fresh!r}")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CAP):
        raise ValueError(f"moe_routing_shared_cap must be null (no bound) or an int in [1, {MAX_CAP}], got {cap!r}")
    if cap is not None and fresh is None:
        raise ValueError("moe_routing_shared_cap needs moe_routing_shared_fresh (the cap bounds a group's fresh draws)")


class GroupRouting:
    """The later members' part of routing groups (module docstring) for experts of inclusion
    probabilities pi at a locality; keeps each cap's binomial table (a fit tries many figures)."""

    def __init__(self, pi: npt.NDArray[np.float64], locality: float) -> None:
        self.pi = pi
        self.locality = float(locality)
        self._binomials: dict[int, npt.NDArray[np.float64]] = {}

    def _log_binomial(self, cap: int) -> npt.NDArray[np.float64]:
        """log P(r) of Binomial(cap, pi_e), a row per expert, r = 0..cap (log 0 where pi is 0 or 1)."""
        table = self._binomials.get(cap)
        if table is None:
            r = np.arange(cap + 1, dtype=np.float64)
            log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, cap + 1)))])
            log_choose = log_factorial[cap] - log_factorial - log_factorial[::-1]
            with np.errstate(divide="ignore", invalid="ignore"):
                log_p, log_q = np.log(self.pi)[:, None], np.log1p(-self.pi)[:, None]
                table = log_choose + np.where(r > 0, r * log_p, 0.0) + np.where(r < cap, (cap - r) * log_q, 0.0)
            self._binomials[cap] = table
        return table

    def later_log_untouched(self, later: Sequence[int], fresh: float, cap: int | None) -> npt.NDArray[np.float64]:
        """log of the probability that a group's later members (their new tokens each) leave each
        expert untouched (module docstring)."""
        counts = Counter(int(n) for n in later if n > 0)  # members of equal size alike (decodes: all 1)
        draws = {n: fresh / (1.0 + self.locality * np.arange(n)) for n in counts}  # a_t of each member size
        with np.errstate(divide="ignore"):  # an expert every top-k includes (pi = 1): log 0
            if cap is None:
                return sum((c * np.log1p(-np.outer(draws[n], self.pi)).sum(axis=0) for n, c in counts.items()),
                           np.zeros(len(self.pi)))
            share = np.arange(cap + 1, dtype=np.float64) / cap  # r / M
            log_kept = sum((c * np.log1p(-np.outer(draws[n], share)).sum(axis=0) for n, c in counts.items()),
                           np.zeros(cap + 1))
            out: npt.NDArray[np.float64] = np.logaddexp.reduce(self._log_binomial(cap) + log_kept, axis=1)
            return out
