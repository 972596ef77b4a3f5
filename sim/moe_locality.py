"""Routing locality: the tokens of one sequence choosing alike, and the distinct experts of a step
counted from its sequences.

sim.moe prices a step of N tokens by D(N), the expected distinct experts of N tokens that route
independently. The tokens of one prompt do not: on Qwen3-30B-A3B with random weights one prompt
of 256 tokens touched 28 experts per layer where D(256) = 128, and one of 2048 only 33
(experiments/fidelity/h100_30b_r2). The count grows with the logarithm of the prompt's length,
which is what a sequence whose tokens repeat earlier tokens' routing gives:

    token j of a sequence (j = 0, 1, ...) draws a fresh top-k, independently of every other draw
    (the skew's inclusion probabilities pi_e), with probability 1 / (1 + locality j); otherwise
    it reuses the top-k of one of the sequence's earlier tokens.

A sequence of n tokens then makes n_eff(n) = sum_{j<n} 1 / (1 + locality j) fresh draws in
expectation (about ln(locality n) / locality for large n: the Chinese-restaurant growth of a
concentration 1 / locality), and since the fresh draws are independent Bernoulli trials, expert e
is untouched by the sequence with probability

    U_e(n) = prod_{j<n} (1 - pi_e / (1 + locality j))

exactly. Sequences (and a decode's single token: n = 1, one fresh draw) route independently of
each other, so a step with sequences of n_1, n_2, ... new tokens touches, in expectation,

    D_step = sum_e 1 - prod_i U_e(n_i)

experts per MoE layer. locality 0 (the default) is independent routing: U_e(n) = (1 - pi_e)^n and
D_step = D(n_1 + n_2 + ...), the same number sim.moe gives. D_step is increasing in every n_i and
at most min(E, k N). A decode batch of B sequences is priced D(B) at any locality.

Sequences that start with the same tokens route alike across sequences too: distinct() takes a
routing group (sim.features.routing_sequences) as the tuple of its members' new tokens and prices
it by sim.moe_groups (shared_fresh, shared_cap); shared_fresh None is the rule without measured
figures, the group routing as one sequence of all its members' tokens.

fit_routing_locality estimates the locality from the distinct experts an engine's profiled steps
really touched (harness.calibration.expert_steps), the skew held at its own fit
(sim.moe.fit_routing_skew): the two are separate, since reusing earlier tokens' top-k leaves every
expert's share of the routed tokens as it was.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from sim.moe import ExpertRouting, inclusion_probabilities
from sim.moe_groups import GroupRouting, check_shared

# Largest locality the fit reports: beyond it a sequence of any length makes about one fresh draw.
MAX_LOCALITY = 1000.0
_GOLDEN_STEPS = 40


def check_locality(locality: float, name: str = "moe_routing_locality") -> None:
    """ValueError naming the field."""
    if isinstance(locality, bool) or not isinstance(locality, (int, float)) or not 0.0 <= locality <= MAX_LOCALITY:
        raise ValueError(f"{name} must be a number in [0, {MAX_LOCALITY:g}] (0: a sequence's tokens route "
                         f"independently), got {locality!r}")


def fresh_draws(num_tokens: int, locality: float) -> float:
    """n_eff: the expected fresh top-k draws of one sequence's num_tokens tokens (module docstring)."""
    check_locality(locality)
    return float(np.sum(1.0 / (1.0 + locality * np.arange(max(int(num_tokens), 0)))))


class SequenceRouting:
    """The expected distinct experts of a step from its sequences' new tokens (module docstring),
    for one model's routing; memoised per step composition (the simulator asks once per step)."""

    def __init__(self, num_experts: int, top_k: int, skew: float = 0.0, locality: float = 0.0,
                 shared_fresh: float | None = None, shared_cap: int | None = None) -> None:
        check_locality(locality)
        check_shared(shared_fresh, shared_cap)
        self.independent = ExpertRouting(num_experts, top_k, skew)
        self.locality = float(locality)
        self.shared_fresh = None if shared_fresh is None else float(shared_fresh)
        self.shared_cap = shared_cap
        # experts that share an inclusion probability share a column (uniform routing: one)
        self._pi, self._weight = np.unique(inclusion_probabilities(num_experts, top_k, skew), return_counts=True)
        self._log_untouched = np.zeros((1, len(self._pi)))  # row n: log U_e(n), grown on demand
        self._groups = GroupRouting(self._pi, self.locality)
        self._memo: dict[tuple[tuple[int, ...], ...], float] = {}

    def with_shared(self, fresh: float | None, cap: int | None) -> SequenceRouting:
        """This routing with other shared-prefix figures (module docstring), sharing its per-sequence
        table (a fit tries many)."""
        other = SequenceRouting.__new__(SequenceRouting)
        other.__dict__.update(self.__dict__)
        check_shared(fresh, cap)
        other.shared_fresh = None if fresh is None else float(fresh)
        other.shared_cap = cap
        other._memo = {}
        return other

    def _table(self, longest: int) -> npt.NDArray[np.float64]:
        have = len(self._log_untouched) - 1
        if longest > have:
            size = max(longest, 2 * have)
            fresh = 1.0 / (1.0 + self.locality * np.arange(have, size, dtype=np.float64))
            with np.errstate(divide="ignore"):  # an expert every token includes (pi = 1): log 0
                steps = np.log1p(-np.outer(fresh, self._pi))
            grown = self._log_untouched[-1] + np.cumsum(steps, axis=0)
            self._log_untouched = np.vstack([self._log_untouched, grown])
        return self._log_untouched

    def distinct(self, sizes: Sequence[int | tuple[int, ...]]) -> float:
        """Expected distinct experts per MoE layer of a step whose routing sequences bring sizes new
        tokens: an int per sequence, a tuple of its members' per routing group (module docstring)."""
        groups = [(int(g),) if isinstance(g, (int, np.integer)) else tuple(int(n) for n in g) for g in sizes]
        if self.locality == 0.0 and (self.shared_fresh is None or all(len(g) == 1 for g in groups)):
            return self.independent.distinct(sum(sum(g) for g in groups))
        if self.shared_fresh is None:  # a group routes as one sequence of its members' tokens
            groups = [(sum(g),) for g in groups]
        key = tuple(sorted(tuple(sorted((n for n in g if n > 0), reverse=True)) for g in groups if sum(g) > 0))
        value = self._memo.get(key)
        if value is None:
            if not key:
                return 0.0
            table = self._table(max(g[0] for g in key))
            log_untouched = table[np.asarray([g[0] for g in key])].sum(axis=0)
            for group, count in Counter(g for g in key if len(g) > 1).items():  # equal groups priced once
                assert self.shared_fresh is not None  # groups without one were merged above
                log_untouched = log_untouched + count * self._groups.later_log_untouched(
                    group[1:], self.shared_fresh, self.shared_cap)
            value = float(np.dot(self._weight, -np.expm1(log_untouched)))
            if len(self._memo) < 1 << 16:
                self._memo[key] = value
        return value


def squared_log_error(routing: SequenceRouting, steps: Sequence[Sequence[int | tuple[int, ...]]],
                      observed: npt.NDArray[np.float64]) -> float:
    """sum of log(predicted / observed)^2 over steps (each its routing sequences: SequenceRouting.distinct)."""
    predicted = np.array([routing.distinct(sizes) for sizes in steps])
    return float(np.sum(np.log(predicted / observed) ** 2))


def _squared_log_error(steps: Sequence[Sequence[int]], observed: npt.NDArray[np.float64], num_experts: int,
                       top_k: int, skew: float, locality: float) -> float:
    return squared_log_error(SequenceRouting(num_experts, top_k, skew, locality), steps, observed)


def fit_routing_locality(steps: Sequence[Sequence[int]], observed: Sequence[float] | npt.ArrayLike,
                         num_experts: int, top_k: int, skew: float = 0.0) -> float:
    """The locality (module docstring) that best explains the distinct experts steps touched:
    least squares of log(predicted / observed) over [0, MAX_LOCALITY] (a log-spaced grid, then
    golden-section search in log locality around its best).

    steps: each step's new tokens per sequence; observed: the distinct experts per MoE layer each
    touched (the profile's moe_distinct_experts); skew: the routing skew fitted to the same run."""
    counts = np.asarray(observed, dtype=np.float64)
    if len(steps) != len(counts) or not len(counts) or not np.all(np.isfinite(counts)) or np.any(counts <= 0):
        raise ValueError(f"fit_routing_locality needs one positive observed count per step, got {len(counts)} counts "
                         f"for {len(steps)} steps")
    if any(not sizes or min(sizes) < 1 for sizes in steps):
        raise ValueError("fit_routing_locality: every step needs sequences of at least one new token")

    def loss(log_locality: float) -> float:
        return _squared_log_error(steps, counts, num_experts, top_k, skew, math.exp(log_locality))

    grid = np.linspace(math.log(1e-3), math.log(MAX_LOCALITY), 61)
    losses = [loss(x) for x in grid]
    best = int(np.argmin(losses))
    if _squared_log_error(steps, counts, num_experts, top_k, skew, 0.0) <= losses[best]:
        return 0.0
    return float(math.exp(golden_minimum(loss, grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])))


def golden_minimum(loss: Callable[[float], float], low: float, high: float, steps: int = _GOLDEN_STEPS) -> float:
    """The minimum of a unimodal loss on [low, high] by golden-section search (its bracket's middle)."""
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(steps):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if loss(a) <= loss(b):
            high = b
        else:
            low = a
    return 0.5 * (low + high)
