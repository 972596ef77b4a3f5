"""Carry a profiled model fitted on one GPU to another by the ratio of their datasheet figures.

NOTE: the rule, per part of the fit (sim.profiled), with F = peak_flops and B = mem_bandwidth of
the source (s) and target (t) HardwareSpec (conf/hardware):
- decode regimes' size function (a decode step reads every weight once and computes little):
  memory-bound, x B_s / B_t;
- prefill regimes' size function at a knot of n tokens: a linear layer of P bf16 parameters
  computes 2Pn FLOPs and reads 2P bytes, so it takes max(n / F, 1 / B) in units of 2P:
  x max(n / F_t, 1 / B_t) / max(n / F_s, 1 / B_s), memory-bound for small chunks and compute-bound
  past n = F / B tokens (295 on an H100);
- prefill_attention_pairs (attention FLOPs): compute-bound, x F_s / F_t;
- decode_context_tokens (KV reads): memory-bound, x B_s / B_t;
- decode_repeated_tokens (its coefficient b: a token read again, from L2, costs a + b, with a the
  decode_context_tokens coefficient): a + b x L2_s / L2_t, a x B_s / B_t, so
  b -> (a + b) L2_s / L2_t - a B_s / B_t; prefill_repeated_tokens: x L2_s / L2_t (L2 =
  l2_bandwidth; where either GPU has no L2 figure, B stands in for it);
- num_seqs, num_seeded (per-row launches, sampler generators), the host and launch fits and the
  launch delay: host work, unchanged (the same host CPU is assumed);
- gpu fits (device time alone) follow their regime's rule.
Efficiency factors are taken to be equal on both GPUs; what that misses (an H200 that reaches a
different share of its bandwidth) is the transfer's error, which only a measurement can show.
"""

from __future__ import annotations

from dataclasses import replace

from sim.features import REPEATED_FEATURES
from sim.piecewise import PiecewiseLinearFit
from sim.profiled import HOST_REGIME, ProfiledCostModel
from sim.repeated_reads import FIRST_READS, REPEATED_READS
from sim.specs import HardwareSpec

MEMORY_BOUND_FEATURES = ("decode_context_tokens",)
COMPUTE_BOUND_FEATURES = ("prefill_attention_pairs",)
DECODE_REGIMES = ("decode_graph", "decode_eager")
PREFILL_REGIMES = ("prefill", "prefill_graph")


def transfer(model: ProfiledCostModel, source: HardwareSpec, target: HardwareSpec) -> ProfiledCostModel:
    """A copy of model (fitted on source) whose device parts are scaled to target (rule above)."""
    fits = {}
    for name, fit in model.fits.items():
        part, _, regime = name.rpartition(":")
        if name == HOST_REGIME or part == "launch":
            fits[name] = fit
        else:
            fits[name] = _scale_fit(fit, regime, source, target)
    moved = ProfiledCostModel(fits, model.graphs)
    moved.launch_delay_s = model.launch_delay_s
    return moved


def knot_scale(regime: str, size: float, source: HardwareSpec, target: HardwareSpec) -> float:
    """Factor on a regime's size function at one knot (the rule in the module docstring)."""
    if regime in DECODE_REGIMES:
        return source.mem_bandwidth / target.mem_bandwidth
    if regime not in PREFILL_REGIMES:
        raise ValueError(f"no transfer rule for regime {regime!r}; known: {DECODE_REGIMES + PREFILL_REGIMES}")
    ours = max(size / target.peak_flops, 1.0 / target.mem_bandwidth)
    theirs = max(size / source.peak_flops, 1.0 / source.mem_bandwidth)
    return ours / theirs


def _scale_fit(fit: PiecewiseLinearFit, regime: str, source: HardwareSpec, target: HardwareSpec) -> PiecewiseLinearFit:
    values = tuple(v * knot_scale(regime, k, source, target) for k, v in zip(fit.knots, fit.knot_values))
    memory = source.mem_bandwidth / target.mem_bandwidth
    l2 = memory
    if source.l2_bandwidth is not None and target.l2_bandwidth is not None:
        l2 = source.l2_bandwidth / target.l2_bandwidth
    first = dict(zip(fit.linear_features, fit.linear_coefs)).get(FIRST_READS, 0.0)
    coefs = []
    for feature, coef in zip(fit.linear_features, fit.linear_coefs):
        if feature in MEMORY_BOUND_FEATURES:
            coef *= memory
        elif feature in COMPUTE_BOUND_FEATURES:
            coef *= source.peak_flops / target.peak_flops
        elif feature == REPEATED_READS:
            coef = (first + coef) * l2 - first * memory
        elif feature in REPEATED_FEATURES:
            coef *= l2
        coefs.append(coef)
    return replace(fit, knot_values=values, linear_coefs=tuple(coefs))
