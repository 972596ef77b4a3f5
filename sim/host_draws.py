"""One step's draw of the host's speed (sim.host_speed): exp(N(0, sigma)) from (seed, step) alone,
so a step gets the same draw whichever order steps are priced in (fast-forward prices a run's
decode repeats ahead of the step-by-step order; engine.core.fast_forward)."""

from __future__ import annotations

import math

_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of value."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _uniform(seed: int, step: int, k: int) -> float:
    """A uniform number in (0, 1] for (seed, step, k)."""
    return ((_mix(_mix(seed & _MASK) ^ ((2 * step + k) & _MASK)) >> 11) + 1) / float(1 << 53)


def host_draw(seed: int, step: int, sigma: float) -> float:
    """exp(sigma z), z a standard normal drawn for (seed, step) (Box-Muller); 1 for sigma 0."""
    if sigma == 0.0:
        return 1.0
    z = math.sqrt(-2.0 * math.log(_uniform(seed, step, 0))) * math.cos(2.0 * math.pi * _uniform(seed, step, 1))
    return math.exp(sigma * z)
