"""Carry a profiled model fitted on one GPU to another by the ratio of their datasheet figures.

NOTE: the rule, per part of the fit (sim.profiled), with F = peak_flops and B = mem_bandwidth of
the source (s) and target (t) HardwareSpec (conf/hardware):
- every regime's size function (a step's base at n tokens, before its context terms): the part
  of it that the roofline explains, e = min(value, r_s(n)) with r(n) the roofline's weights and
  linear layers of n tokens (sim.roofline: max of the FLOPs over F and the weight bytes over B,
  with the GPU's efficiencies), moves to e r_t(n) / r_s(n); the rest, the kernels' latency floors
  that neither bandwidth nor peak FLOP/s set, stays. Decode is memory-bound (r = weights / B) and
  long prefill chunks compute-bound. Measured on Qwen3-0.6B (a 1.2 GB model whose small steps are
  mostly kernel floors; experiments/fidelity/h200/): the H200's decode base is 0.93-1.0 of the
  H100's, not 3.35 / 4.8 = 0.70, and scaling it all by bandwidth predicted TPOT 20-29% short;
- prefill_attention_pairs (attention FLOPs): compute-bound, x F_s / F_t;
- decode_context_tokens (KV reads): memory-bound, x B_s / B_t (measured: 0.68-0.69 of the H100's);
  an MoE profile's moe_distinct_experts (the touched experts' weights) likewise;
- decode_repeated_tokens (its coefficient b: a token read again, from L2, costs a + b, with a the
  decode_context_tokens coefficient): a + b x L2_s / L2_t, a x B_s / B_t, so
  b -> (a + b) L2_s / L2_t - a B_s / B_t; prefill_repeated_tokens: x L2_s / L2_t (L2 =
  l2_bandwidth; where either GPU has no L2 figure, B stands in for it);
- num_seqs, num_seeded (per-row launches, sampler generators), the host, launch and lead fits and
  the launch delay: host work, unchanged (the same host CPU is assumed);
- gpu fits (device time alone) follow their regime's rule.
Efficiency factors are each GPU's own (conf/hardware); what they miss (an H200 that reaches a
different share of its bandwidth) is the transfer's error, which only a measurement can show.
"""

from __future__ import annotations

from dataclasses import replace

from sim.features import MOE_FEATURES, REPEATED_FEATURES
from sim.piecewise import PiecewiseLinearFit
from sim.profiled import HOST_PARTS, HOST_REGIME, ProfiledCostModel
from sim.repeated_reads import FIRST_READS, REPEATED_READS
from sim.roofline import RooflineCostModel
from sim.specs import HardwareSpec, ModelSpec

MEMORY_BOUND_FEATURES = ("decode_context_tokens", *MOE_FEATURES)  # KV reads; touched experts' weights
COMPUTE_BOUND_FEATURES = ("prefill_attention_pairs",)
DECODE_REGIMES = ("decode_graph", "decode_eager")
PREFILL_REGIMES = ("prefill", "prefill_graph")


def transfer(model: ProfiledCostModel, source: HardwareSpec, target: HardwareSpec, spec: ModelSpec,
             tp_size: int = 1) -> ProfiledCostModel:
    """A copy of model (spec's steps at tp_size, fitted on source) whose device parts are scaled to
    target (rule above)."""
    rooflines = (RooflineCostModel(spec, source, tp_size), RooflineCostModel(spec, target, tp_size))
    fits = {}
    for name, fit in model.fits.items():
        part, _, regime = name.rpartition(":")
        if name == HOST_REGIME or part in HOST_PARTS:
            fits[name] = fit
        else:
            fits[name] = _scale_fit(fit, regime, source, target, rooflines)
    moved = ProfiledCostModel(fits, model.graphs)
    moved.launch_delay_s = model.launch_delay_s
    moved.loop_s, moved.loop_per_seq_s = model.loop_s, model.loop_per_seq_s  # host time: not the GPU's
    moved.distinct_experts = model.distinct_experts
    moved.prefill_programs = model.prefill_programs  # the target's, where the builder knows it
    moved.merge_programs = model.merge_programs  # the target's decode kernel; its merge price is a latency, kept
    return moved


def elementwise_bytes(spec: ModelSpec, tp_size: int = 1) -> float:
    """Bytes one token moves through memory in a step's elementwise kernels on one rank (the
    engine's fused Triton kernels, engine.layers.fused), per layer: the two residual-add norms
    (read x and the residual, write both: 4 hidden each), q/k norm with rotary and the KV store
    (read q, k, v; write q, k and k, v into the cache: 2 q + 5 kv), attention's reads of q, k, v
    and write of its output (2 q + 2 kv) and SwiGLU (read gate and up, write their product:
    3 intermediate, each of an MoE layer's top-k experts); plus the final norm (4 hidden)."""
    hidden = spec.hidden_size
    q = spec.num_heads // tp_size * spec.head_dim
    kv = spec.kv_heads_per_rank(tp_size) * spec.head_dim
    attention = 8 * hidden + 4 * q + 7 * kv
    dense = 3 * (spec.intermediate_size // tp_size)
    moe = 3 * spec.num_experts_per_tok * (spec.moe_intermediate_size // tp_size)
    per_layer = spec.num_layers * attention + spec.num_dense_layers * dense + spec.num_moe_layers * moe
    return float((per_layer + 4 * hidden) * spec.dtype_bytes)


def explained_base(roofline: RooflineCostModel, regime: str, size: float) -> float:
    """Seconds of a regime's step base at `size` tokens that the roofline explains: the linear
    layers' weights and FLOPs (an MoE model's touched experts too), the LM head where every
    row samples (decode), and the elementwise kernels' traffic (elementwise_bytes)."""
    if regime not in DECODE_REGIMES + PREFILL_REGIMES:
        raise ValueError(f"no transfer rule for regime {regime!r}; known: {DECODE_REGIMES + PREFILL_REGIMES}")
    tokens = max(1, int(round(size)))
    phases = roofline.phase_times(tokens, tokens if regime in DECODE_REGIMES else 0, 0, 0, tokens)
    hardware = roofline.hardware
    streamed = elementwise_bytes(roofline.model, roofline.tp_size) * tokens / (
        hardware.mem_bandwidth * hardware.bandwidth_efficiency)
    return phases["linear"] + phases.get("experts", 0.0) + phases["lm_head"] + streamed


def carried_knot(value: float, regime: str, size: float,
                 rooflines: tuple[RooflineCostModel, RooflineCostModel]) -> float:
    """A size function's value at one knot on the target: its roofline part rescaled, the rest kept."""
    source, target = (explained_base(r, regime, size) for r in rooflines)
    explained = min(value, source)
    return value - explained + explained * target / source


def _scale_fit(fit: PiecewiseLinearFit, regime: str, source: HardwareSpec, target: HardwareSpec,
               rooflines: tuple[RooflineCostModel, RooflineCostModel]) -> PiecewiseLinearFit:
    values = tuple(carried_knot(v, regime, k, rooflines) for k, v in zip(fit.knots, fit.knot_values))
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
