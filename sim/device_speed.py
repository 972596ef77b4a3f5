"""The serving GPU's speed against the GPU that measured the profile: two GPUs of one kind.

A profile is fitted on one machine's grid; another machine of the same GPU kind runs the same
steps a few percent faster or slower (clocks, power limits, memory, cooling). Measured on the
code_completion class (experiments/fidelity/README.md, "The serving GPU's speed"): the drains of
one H200 ran 4.6-6.1% longer than the fit made on another H200's grid priced them at their host,
and its decode graph steps, which no host moves, 5-7% longer under load; an H100 ran Qwen3-8B's
drain steps 2.5-2.7% longer than the 8B fit's machine. Near saturation the class's queueing turns
such a few percent into tens of percent of TPOT.

with_device_scale(model, s) prices every step's device work (the fitted duration of a step the
device bounds, and the device time alone of an overlapped one) s times the profile's; launches,
leads and host time keep the profile's (the host's speed is sim.host_speed's).

Not measured by the held-out protocol: a drain's steps over their price at its host
(experiments/fidelity/cause/host_scales.py, device_scale) also hold what a GPU held at its power
limit loses (2.4% on the profiling grid's own H200), which loaded cells lose less, so that reading
priced the grid machine's own cells worse (experiments/fidelity/README.md, "The serving GPU's
speed").
"""

from __future__ import annotations

from sim.host_speed import check_host_scale
from sim.profiled import ProfiledCostModel
from sim.repeated_reads import copy_with_fits


def check_device_scale(value: object, name: str = "device_scale") -> float:
    """value as a float > 0, or a one-line ValueError naming the field."""
    return check_host_scale(value, name, "the serving GPU's step time against the profile's GPU; 1: the profile's GPU")


def with_device_scale(model: ProfiledCostModel, scale: float) -> ProfiledCostModel:
    """A copy of model whose device work takes scale times the profile's (module docstring)."""
    moved = copy_with_fits(model, dict(model.fits))
    moved.device_scale = model.device_scale * check_device_scale(scale)
    return moved
