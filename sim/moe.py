"""Expert routing as the simulator prices it: how many distinct experts a step's tokens touch.

A mixture-of-experts layer reads the weights of every expert that at least one of the step's
tokens chose, so its cost depends on the batch: B tokens each choosing k of E experts touch

    D(B) = sum_e 1 - (1 - pi_e)^B

experts in expectation, where pi_e is the probability that one token's top-k includes expert e
(sum_e pi_e = k, each pi_e <= 1) and tokens route independently. Derivation: expert e is untouched
when no token includes it, probability (1 - pi_e)^B; D is the sum of the experts' touched
probabilities (linearity of expectation).

- Uniform routing (skew 0): a token's top-k is a uniformly random k-subset, so
  pi_e = C(E-1, k-1) / C(E, k) = k / E exactly (the hypergeometric count of subsets holding e)
  and D(B) = E (1 - (1 - k/E)^B). Exact under independence, not an approximation of it.
- Skewed routing (skew s > 0): experts' popularities follow a Zipf law, w_r = r^-s for the expert
  of rank r = 1..E. The inclusion probabilities are pi_e = min(1, c w_e), c chosen so that they
  sum to k (capped proportional inclusion: the most popular experts saturate at 1). The issue's
  rougher form sum_e 1 - (1 - p_e)^(B k) (B k draws with replacement, p_e = w_e / sum w) counts
  a token's k choices as independent and overstates D for small E / k; the inclusion form is
  exact for any top-k sampler with these inclusion probabilities (tests check it by Monte Carlo
  with systematic sampling, which realises them exactly).

Properties (tests/sim/test_moe_routing.py): D(1) = k; D is increasing and concave in B, at most
min(E, B k), and tends to E; a larger skew never touches more experts.

fit_routing_skew estimates s from what an engine observed (per-expert token counts of a run,
one histogram per layer or their sum): each expert's share of the routed assignments is pi_e / k,
so the skew is measured rather than assumed uniform. The engine records them with
backend.record_expert_counts=true (engine.expert_counts; a run folder's expert_counts.csv, which
read_routing_counts reads).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sim.specs import HardwareSpec, ModelSpec

# Largest skew fit_routing_skew reports: beyond it nearly every token goes to the top-k experts.
MAX_SKEW = 8.0
_GOLDEN_STEPS = 30


def check_routing(num_experts: int, top_k: int, skew: float) -> None:
    """ValueError naming the bad argument."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be an int >= 1, got {num_experts!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"num_experts_per_tok must be an int in [1, num_experts={num_experts}], got {top_k!r}")
    if isinstance(skew, bool) or not isinstance(skew, (int, float)) or not 0.0 <= skew < math.inf:
        raise ValueError(f"moe_routing_skew must be a finite number >= 0 (0: uniform routing), got {skew!r}")


def inclusion_probabilities(num_experts: int, top_k: int, skew: float = 0.0) -> npt.NDArray[np.float64]:
    """pi_e, most popular expert first: min(1, c r^-skew) summing to top_k (module docstring)."""
    check_routing(num_experts, top_k, skew)
    weights = np.arange(1, num_experts + 1, dtype=np.float64) ** -float(skew)
    pi = np.zeros(num_experts)
    remaining, free = float(top_k), np.ones(num_experts, dtype=bool)
    # Water-filling: scale the free experts to the remaining mass; those that overflow cap at 1.
    # Popularity is decreasing, so the capped ones are a prefix and this ends in at most k rounds.
    while True:
        scaled = weights[free] * remaining / weights[free].sum()
        if scaled.max() <= 1.0:
            pi[free] = scaled
            return pi
        first = int(np.argmax(free))
        pi[first], free[first] = 1.0, False
        remaining -= 1.0


def expected_distinct_experts(num_tokens: int | float, num_experts: int, top_k: int, skew: float = 0.0) -> float:
    """Expected distinct experts that num_tokens tokens touch in one layer (module docstring)."""
    if num_tokens <= 0:
        return 0.0
    if skew == 0:
        check_routing(num_experts, top_k, skew)
        return num_experts * -math.expm1(num_tokens * math.log1p(-top_k / num_experts)) \
            if top_k < num_experts else float(num_experts)
    pi = inclusion_probabilities(num_experts, top_k, skew)
    return float(np.sum(1.0 - np.power(1.0 - pi, float(num_tokens))))


class ExpertRouting:
    """One model's routing (E experts, top-k, skew), with the distinct count memoised per token
    count: the simulator asks it once per simulated step."""

    def __init__(self, num_experts: int, top_k: int, skew: float = 0.0) -> None:
        check_routing(num_experts, top_k, skew)
        self.num_experts, self.top_k, self.skew = num_experts, top_k, float(skew)
        self._memo: dict[int, float] = {}

    def distinct(self, num_tokens: int) -> float:
        value = self._memo.get(num_tokens)
        if value is None:
            value = expected_distinct_experts(num_tokens, self.num_experts, self.top_k, self.skew)
            if len(self._memo) < 1 << 16:
                self._memo[num_tokens] = value
        return value


def _log_likelihood(ranked: npt.NDArray[np.float64], top_k: int, skew: float) -> float:
    """Log-likelihood of rank-sorted routing counts (rows: layers) when each expert's share of the
    routed assignments is its inclusion probability over k."""
    shares = inclusion_probabilities(ranked.shape[1], top_k, skew) / top_k
    return float((ranked * np.log(shares)).sum())


def fit_routing_skew(counts: Sequence[int] | Sequence[Sequence[int]] | npt.ArrayLike, top_k: int) -> float:
    """The skew (Zipf exponent) that best explains observed per-expert routing counts (maximum
    likelihood over [0, MAX_SKEW]: a grid of 0.05, then golden-section search around its best).

    counts: token assignments routed to each expert, one row per layer (or one row, summed over
    layers; a layer's own ranking is what the pricing assumes, so per-layer rows are better);
    top_k: the model's num_experts_per_tok. Each row is sorted by popularity and all rows share one
    exponent. NOTE: ranking the observed counts makes even uniform routing look slightly skewed
    (sampling noise sorted); with a few hundred assignments per expert the bias is below 0.06
    (tests measure it).
    """
    array = np.asarray(counts, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] < 2 or not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("routing counts must be a non-negative histogram over >= 2 experts "
                         f"(one row per layer), got shape {array.shape}")
    if array.sum() <= 0:
        raise ValueError("routing counts are all zero: no routed token to estimate the skew from")
    check_routing(array.shape[1], top_k, 0.0)
    ranked = -np.sort(-array, axis=1)
    grid = np.linspace(0.0, MAX_SKEW, int(MAX_SKEW / 0.05) + 1)
    best = int(np.argmax([_log_likelihood(ranked, top_k, s) for s in grid]))
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(_GOLDEN_STEPS):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if _log_likelihood(ranked, top_k, a) >= _log_likelihood(ranked, top_k, b):
            high = b
        else:
            low = a
    return float(0.5 * (low + high))


def read_routing_counts(path: str | Path) -> npt.NDArray[np.float64]:
    """An engine's expert_counts.csv (columns layer, expert, tokens: engine.expert_counts) as the
    [layers, experts] histogram fit_routing_skew takes, layers and experts in ascending order."""
    import pandas as pd

    table = pd.read_csv(path)
    missing = {"layer", "expert", "tokens"} - set(table.columns)
    if missing:
        raise ValueError(f"{path}: routing counts need the columns layer, expert, tokens; missing {sorted(missing)}")
    wide = table.pivot_table(index="layer", columns="expert", values="tokens", aggfunc="sum", fill_value=0)
    counts: npt.NDArray[np.float64] = wide.sort_index().sort_index(axis=1).to_numpy(dtype=np.float64)
    return counts


# Rows of a grouped GEMM's tile: each expert's rows are padded to a multiple of it, so an expert
# that got m tokens costs the FLOPs of ceil(m / 64) x 64 rows. vLLM's fused MoE kernel picks this
# tile height once tokens outnumber experts; the engine's Triton kernel is of the same design.
GROUPED_GEMM_BLOCK_M = 64


class ExpertPhase:
    """The experts of every MoE layer in one step, per rank of a TP group (each expert's
    intermediate dimension sharded over tp_size ranks):

    - weights: each touched expert's gate/up/down shard read once: D(B) x expert bytes per layer;
    - FLOPs: 2 x (rows padded to the grouped GEMM's tile) x expert params per layer, with
      B k rows spread over D(B) experts, m = B k / D rows each, padded to ceil(m / 64) x 64 (the
      grouped GEMM's efficiency at small per-expert counts: a few rows cost a whole tile);
    - activations: each token's k copies in and out of gate/up and down.
    The phase takes max(compute, memory), like the roofline's other phases."""

    def __init__(self, model: ModelSpec, tp_size: int, skew: float, matmul_rate: float,
                 bandwidth: float) -> None:
        self.routing = ExpertRouting(model.num_experts, model.num_experts_per_tok, skew)
        layers = model.num_moe_layers
        inter = model.moe_intermediate_size // tp_size
        params = model.expert_params(tp_size)
        self._k = model.num_experts_per_tok
        self._flops_per_row = 2.0 * layers * params / matmul_rate
        self._seconds_per_expert = layers * params * model.dtype_bytes / bandwidth
        per_copy = (model.hidden_size + 2 * inter) + (inter + model.hidden_size)
        self._seconds_per_token = layers * self._k * per_copy * model.dtype_bytes / bandwidth

    def time(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        distinct = self.routing.distinct(num_tokens)
        rows = num_tokens * self._k / distinct
        padded = distinct * math.ceil(rows / GROUPED_GEMM_BLOCK_M - 1e-9) * GROUPED_GEMM_BLOCK_M
        compute = self._flops_per_row * padded
        memory = self._seconds_per_expert * distinct + self._seconds_per_token * num_tokens
        return compute if compute > memory else memory


class WeightReadFloor:
    """The least time a step of an MoE model can take on one rank of a TP group: the weights it
    must read, each once, at the hardware's copy bandwidth (mem_bandwidth x bandwidth_efficiency,
    as the roofline reads them): every weight but the experts (attention, routers, dense layers,
    norms, the LM head), the distinct experts its tokens touch (the step's moe_distinct_experts)
    and the KV tokens its decodes read from memory (repeated reads left out: L2 may serve them).

    A profiled model of an MoE model prices no step below it (sim.cost_model sets it): a fit whose
    terms compensate each other can go below what the step must read where the step leaves the
    grid's shapes, and no kernel reads faster than the copy bandwidth. With expert parallelism
    the mean rank reads D / tp whole experts, the same bytes as D slices, so it bounds both."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tp_size: int = 1) -> None:
        bandwidth = hardware.mem_bandwidth
        expert = model.num_moe_layers * model.expert_params(tp_size)
        others = model.body_params_per_rank(tp_size) - model.num_experts * expert + model.lm_head_params(tp_size)
        self.others_s = others * model.dtype_bytes / bandwidth
        self.expert_s = expert * model.dtype_bytes / bandwidth  # one expert of every MoE layer
        self.kv_token_s = model.kv_bytes_per_token_per_rank(tp_size) / bandwidth

    def __call__(self, features: Mapping[str, float]) -> float:
        first_reads = max(features["decode_context_tokens"] - features["decode_repeated_tokens"], 0.0)
        return self.others_s + self.expert_s * features["moe_distinct_experts"] + self.kv_token_s * first_reads
