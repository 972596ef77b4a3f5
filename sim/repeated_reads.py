"""Repeated KV reads in a profiled model: the fit's price where the profile measured them, else a
prior from the hardware's L2 bandwidth.

Sequences that share a prefix read the same physical KV blocks (engine.core.kv_reads). The split-KV
decode kernel (kernels/decode_attention.py) reads each sequence's blocks separately, and its
programs run sequence-fastest, so the programs reading one shared block run close together: the
first read comes from memory, the others from L2. A profiled fit prices KV reads by
decode_context_tokens (coefficient a, seconds per token read from memory) and the repeated ones
by decode_repeated_tokens (coefficient b, the change per token read again: L2's price less a).

NOTE: the prior, for a fit whose profile had no such steps (the column was constant, so it has no
coefficient): a token read from L2 costs a x rho, rho = mem_bandwidth / l2_bandwidth (both scaled
by the same bandwidth_efficiency, which cancels), so b = -(1 - rho) a. It is set on the fits of
device time (the regimes and their gpu: parts; launches are host work) that price
decode_context_tokens. Hardware without an L2 figure gets no prior: repeats stay priced as first
reads. prefill_repeated_tokens gets no prior: a prefill chunk's attention is priced by its pairs
(compute), which repeats do not change, only the fit can say more.

The prior adds b x R to the fit's price of the whole context: every repeat costs rho x a, as if the
L2 reads followed the memory reads. rule="overlap" (SimConfig.repeated_reads) prices the same fits
by the slower of the two pipes instead (sim.overlapped_reads: a few repeats ride free behind the
memory reads); "additive" (the default) is the linear prior above.
"""

from __future__ import annotations

from dataclasses import replace

from sim.overlapped_reads import FIRST_READS as FIRST_READS  # the feature names, re-exported for the pricers
from sim.overlapped_reads import REPEATED_READS as REPEATED_READS
from sim.overlapped_reads import OverlappedReads
from sim.piecewise import PiecewiseLinearFit
from sim.profiled import HOST_PARTS, ProfiledCostModel
from sim.specs import HardwareSpec

RULES = ("additive", "overlap")  # SimConfig.repeated_reads: how the prior prices repeats (module docstring)


def check_rule(value: object, name: str = "repeated_reads") -> str:
    """value if it is one of RULES, else a one-line ValueError naming the field and the rules."""
    if value not in RULES:
        raise ValueError(f"{name} must be one of {', '.join(RULES)} (how repeated KV reads are priced: "
                         f"sim/repeated_reads.py), got {value!r}")
    return str(value)


def l2_price_ratio(hardware: HardwareSpec) -> float | None:
    """The price of a KV token read from L2 over one read from memory; None without an L2 figure."""
    if hardware.l2_bandwidth is None:
        return None
    return hardware.mem_bandwidth / hardware.l2_bandwidth


def prior_coefficient(fit: PiecewiseLinearFit, ratio: float) -> float | None:
    """b = -(1 - ratio) a for a fit with a coefficient a of FIRST_READS, else None."""
    if FIRST_READS not in fit.linear_features:
        return None
    return -(1.0 - ratio) * fit.linear_coefs[fit.linear_features.index(FIRST_READS)]


def with_prior(model: ProfiledCostModel, hardware: HardwareSpec, rule: str = "additive") -> ProfiledCostModel:
    """model, with repeated reads priced on each fit of device time that has no price of them
    (module docstring): "additive", the prior coefficient of REPEATED_READS; "overlap", the fits
    named in an OverlappedReads. The model itself where nothing changes."""
    check_rule(rule)
    ratio = l2_price_ratio(hardware)
    if ratio is None:
        return model
    fits = dict(model.fits)
    for name, fit in model.fits.items():
        part, _, _ = name.rpartition(":")
        if part in HOST_PARTS or REPEATED_READS in fit.linear_features:
            continue
        coef = prior_coefficient(fit, ratio)
        if coef is not None:
            fits[name] = replace(fit, linear_features=fit.linear_features + (REPEATED_READS,),
                                 linear_coefs=fit.linear_coefs + (coef,))
    if fits == model.fits:
        return model
    if rule == "overlap":
        moved = copy_with_fits(model, dict(model.fits))
        priced = frozenset(name for name in fits if fits[name] != model.fits[name])
        moved.overlapped_reads = OverlappedReads(min(ratio, 1.0), priced)
        return moved
    return copy_with_fits(model, fits)


def copy_with_fits(model: ProfiledCostModel, fits: dict[str, PiecewiseLinearFit]) -> ProfiledCostModel:
    """A ProfiledCostModel like model (graphs, launch delay, loop work, host and device scale, residuals, routing,
    kernels) with other fits."""
    copy = ProfiledCostModel(fits, model.graphs)
    copy.launch_delay_s = model.launch_delay_s
    copy.loop_s, copy.loop_per_seq_s = model.loop_s, model.loop_per_seq_s
    copy.host_scale = model.host_scale
    copy.device_scale = model.device_scale
    copy.host_jitter, copy.host_seed = model.host_jitter, model.host_seed
    copy.residuals = model.residuals
    copy.distinct_experts = model.distinct_experts
    copy.decode_programs = model.decode_programs
    copy.prefill_programs = model.prefill_programs
    copy.merge_programs = model.merge_programs
    copy.overlapped_reads = model.overlapped_reads
    return copy
