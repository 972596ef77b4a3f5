"""Repeated KV reads that overlap the first reads: a decode step's KV read as the slower of its two
pipes, memory and L2 (SimConfig.repeated_reads="overlap"; sim.repeated_reads has the additive rule).

Every KV byte a decode kernel reads passes through L2 on its way to the SMs; only a block's first
read in the step (its unique tokens U) also comes from memory. Sequences sharing a prefix read its
blocks again (R tokens, decode_repeated_tokens), from L2. The two pipes run at once, so the read
takes max(U x a, (U + R) x a x rho), with a the fit's price of a token read from memory
(decode_context_tokens' coefficient) and rho = L2's price over memory's
(sim.repeated_reads.l2_price_ratio). Against the fit's a x (U + R) that saves a x min(R, (1 - rho)
(U + R)): a few repeats ride free behind the memory reads (R / U below (1 - rho) / rho, 1.68 on an
H100), many make the step L2-bound.

The additive rule prices every repeat at rho x a whatever the step's mix, which is right at the
L2-bound end only. On one H100 (Qwen3-0.6B, Mooncake's conversation trace: every prompt shares its
first 512 tokens, R / U about 0.15) the shipped profile priced the engine's decode graph steps +0.4
to +3.9% summed (median +2.4 to +4.8%) with the additive rule, -1.5 to +0.6% (median +0.6 to +1.3%)
with this one (experiments/serve/h100_run6_aiperf/README.md). On the held-out shared-prefix class
of another H100 call, whose steps share far more, the simulated TTFT / TPOT / latency figures are
within 10% in 19 of 21 (additive: 17), but at 95% load TPOT falls 7-12% under where the additive
rule was 5-9% over: the pipes do not overlap perfectly once L2 carries most of the reads.

Only fits that price decode_context_tokens on the device and have no fitted coefficient of
decode_repeated_tokens are priced so (the prior's fits); a profile that measured repeated reads
keeps its own linear price.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sim.piecewise import PiecewiseLinearFit

FIRST_READS = "decode_context_tokens"
REPEATED_READS = "decode_repeated_tokens"


@dataclass(frozen=True)
class OverlappedReads:
    """ratio: L2's price of a KV token over memory's (rho, in (0, 1]); fits: the names of the fits
    whose KV reads are priced so (the others keep their own price of repeats)."""

    ratio: float
    fits: frozenset[str]

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"OverlappedReads.ratio must be in (0, 1] (L2's price over memory's), got {self.ratio!r}")

    def saving_s(self, name: str, fit: PiecewiseLinearFit, features: Mapping[str, float]) -> float:
        """Seconds the step's repeated reads save under fit `name`'s price of its whole context:
        a x min(R, (1 - rho) x context); 0 for a fit not priced so or a step that repeats nothing."""
        repeated = features.get(REPEATED_READS, 0.0)
        if not repeated or name not in self.fits:
            return 0.0
        per_token = dict(zip(fit.linear_features, fit.linear_coefs)).get(FIRST_READS, 0.0)
        context = features.get(FIRST_READS, 0.0)
        return max(per_token, 0.0) * min(repeated, (1.0 - self.ratio) * context)
