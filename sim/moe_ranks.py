"""Expert parallelism's imbalance: the busiest of n ranks, each holding m = E / n whole experts.

With expert parallelism (ExecutionConfig.expert_parallel) rank r computes only the (token, expert)
pairs routed to its m experts and reads the weights of the ones touched; the step waits for the
busiest rank. Per step of B tokens this module gives, in expectation, the busiest rank's distinct
experts (its weight reads) and pairs (its rows), derived from the routing of sim.moe
(inclusion probabilities pi_e, sum_e pi_e = k), not fitted.

Placement: the engine gives rank r a block of expert ids, and ids say nothing about popularity,
so the set S_r of a rank's experts is modelled as a uniformly random m-subset (ranks
exchangeable). Per rank, over routing and placement:

- pairs N_r = sum over tokens of |top-k of the token within S_r|. Mean B k / n. Variance
  B (k - sum pi^2) (m/E) (E-m)/(E-1) + B^2 m var(pi) (E-m)/(E-1): the first term is the routing's
  (exact from sum_{f != e} pi_ef = (k - 1) pi_e, any pair probabilities), the second the
  placement's (zero when uniform). Uniform, it is B times the hypergeometric variance.
- distinct experts D_r = sum_{e in S_r} I_e, I_e = 1[a token chose e], p_e = 1 - (1 - pi_e)^B.
  Mean D(B) / n. Variance (m/E) sum p q + m(m-1)/(E(E-1)) sum_{e != f} cov(I_e, I_f)
  + m var(p) (E-m)/(E-1), where cov(I_e, I_f) = (1 - pi_e - pi_f + pi_ef)^B - q_e q_f and
  pi_ef = pi_e pi_f (k-1) E / (k (E-1)) (exact for uniform routing, a mean-field estimate with skew).

The ranks' counts are exchangeable and sum to the step's total (N: exactly B k; D: D's own
variance sum p q + sum cov), which fixes their correlation rho = (var(total) / (n s^2) - 1) / (n-1).
The expected maximum of n equicorrelated variables of mean mu, deviation s and skewness g is taken
as mu + s sqrt(1 - rho) (z1 + g (z2 - 1) / 6): z1, z2 the first two moments of the largest of n
independent standard normals (exact for a Gaussian; the g term is the first Cornish-Fisher
correction, the counts being right-skewed), g the skewness of a binomial of that mean and variance,
(2 s^2 / mu - 1) / s. Clamped to what a rank can hold: D to [max(mu, ceil(k / n)), m], since a
step touches at least k experts. tests/sim/test_moe_ranks.py checks both against numpy routing.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from sim.moe import GROUPED_GEMM_BLOCK_M, check_routing, inclusion_probabilities
from sim.specs import ModelSpec


@lru_cache(maxsize=64)
def normal_max_moments(n: int) -> tuple[float, float]:
    """E[Z_max] and E[Z_max^2] for the largest of n independent standard normals (quadrature)."""
    z = np.linspace(-9.0, 9.0, 9001)
    cdf = 0.5 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in z])
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    density = n * pdf * cdf ** (n - 1)
    step = z[1] - z[0]
    return float((z * density).sum() * step), float((z * z * density).sum() * step)


def expected_max(mean: float, var: float, total_var: float, n: int) -> float:
    """Expected largest of n exchangeable counts of this mean and variance whose sum has variance
    total_var (module docstring)."""
    if n == 1 or var <= 0.0:
        return mean
    rho = min(1.0, max(-1.0 / (n - 1), (total_var / (n * var) - 1.0) / (n - 1)))
    sd = math.sqrt(var)
    skew = (2.0 * var / mean - 1.0) / sd if mean > 0 else 0.0
    z1, z2 = normal_max_moments(n)
    return mean + sd * math.sqrt(1.0 - rho) * (z1 + skew * (z2 - 1.0) / 6.0)


class RankBalance:
    """One model's routing over n ranks of m = E / n whole experts: busiest(B) is the busiest rank's
    (distinct experts, pairs) in expectation, memoised per token count."""

    def __init__(self, num_experts: int, top_k: int, skew: float, ranks: int) -> None:
        check_routing(num_experts, top_k, skew)
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1 or num_experts % ranks:
            raise ValueError(f"expert parallelism over {ranks!r} ranks: must be an int >= 1 dividing "
                             f"num_experts={num_experts}")
        self.num_experts, self.top_k, self.ranks = num_experts, top_k, ranks
        self.per_rank = num_experts // ranks
        self._pi = inclusion_probabilities(num_experts, top_k, skew)
        e, k = num_experts, top_k
        self._pair_pi = np.outer(self._pi, self._pi) * ((k - 1) * e / (k * (e - 1)) if e > 1 else 0.0)
        self._memo: dict[int, tuple[float, float]] = {}

    def busiest(self, num_tokens: int) -> tuple[float, float]:
        value = self._memo.get(num_tokens)
        if value is None:
            value = (self._distinct(num_tokens), self._pairs(num_tokens)) if num_tokens > 0 else (0.0, 0.0)
            if len(self._memo) < 1 << 16:
                self._memo[num_tokens] = value
        return value

    def _spread(self) -> float:
        """(m / E) (E - m) / (E - 1): the finite-population factor of a random m-subset."""
        e, m = self.num_experts, self.per_rank
        return m / e * (e - m) / (e - 1) if e > 1 else 0.0

    def _pairs(self, b: int) -> float:
        e, k, m, n, pi = self.num_experts, self.top_k, self.per_rank, self.ranks, self._pi
        routing = b * (k - float(pi @ pi)) * self._spread()
        placement = b * b * e * float(pi.var()) * self._spread()
        mean = b * k / n
        return min(expected_max(mean, routing + placement, 0.0, n), float(b * min(k, m)))

    def _distinct(self, b: int) -> float:
        e, k, m, n = self.num_experts, self.top_k, self.per_rank, self.ranks
        q = (1.0 - self._pi) ** b
        p = 1.0 - q
        both_untouched = np.clip(1.0 - self._pi[:, None] - self._pi[None, :] + self._pair_pi, 0.0, None) ** b
        cov = both_untouched - np.outer(q, q)
        off_diagonal = float(cov.sum() - np.trace(cov))
        sum_pq = float(p @ q)
        pairs_factor = m * (m - 1) / (e * (e - 1)) if e > 1 else 0.0
        var = m / e * sum_pq + pairs_factor * off_diagonal + e * float(p.var()) * self._spread()
        mean = float(p.sum()) / n
        busiest = expected_max(mean, var, max(sum_pq + off_diagonal, 0.0), n)
        return min(max(busiest, mean, float(min(m, math.ceil(k / n)))), float(m))


class RankExpertPhase:
    """sim.moe.ExpertPhase under expert parallelism: the busiest of the tp_size ranks, each holding
    num_experts / tp_size whole experts. Its weights: the busiest rank's distinct experts at full
    width; its FLOPs: that rank's pairs over those experts, padded to the grouped GEMM's tile; its
    activations: that rank's pairs in and out. max(compute, memory), as ExpertPhase (roofline_time).

    What the roofline does not see of the engine's expert parallelism (hardware
    expert_parallel_layer_s and expert_parallel_efficiency, measured on 2 x H200:
    docs/moe-pricing.md): a step pays layer_s per MoE layer, and its grouped GEMMs reach only
    `efficiency` of the roofline's rate, so time = roofline_time / efficiency + layers x layer_s."""

    def __init__(self, model: ModelSpec, tp_size: int, skew: float, matmul_rate: float,
                 bandwidth: float, layer_s: float = 0.0, efficiency: float = 1.0) -> None:
        if not layer_s >= 0.0 or not 0.0 < efficiency <= 1.0:
            raise ValueError(f"expert parallelism: layer_s={layer_s!r} must be >= 0 and efficiency={efficiency!r} "
                             "in (0, 1]")
        self.balance = RankBalance(model.num_experts, model.num_experts_per_tok, skew, tp_size)
        layers, params = model.num_moe_layers, model.expert_params(1)
        inter = model.moe_intermediate_size
        self._flops_per_row = 2.0 * layers * params / matmul_rate
        self._seconds_per_expert = layers * params * model.dtype_bytes / bandwidth
        per_copy = (model.hidden_size + 2 * inter) + (inter + model.hidden_size)
        self._seconds_per_pair = layers * per_copy * model.dtype_bytes / bandwidth
        self._fixed_s = layers * layer_s
        self._efficiency = efficiency

    def roofline_time(self, num_tokens: int) -> float:
        """The busiest rank's max(compute, memory) alone."""
        if num_tokens <= 0:
            return 0.0
        distinct, pairs = self.balance.busiest(num_tokens)
        padded = distinct * math.ceil(pairs / distinct / GROUPED_GEMM_BLOCK_M - 1e-9) * GROUPED_GEMM_BLOCK_M
        compute = self._flops_per_row * padded
        memory = self._seconds_per_expert * distinct + self._seconds_per_pair * pairs
        return compute if compute > memory else memory

    def time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.roofline_time(num_tokens) / self._efficiency + self._fixed_s
