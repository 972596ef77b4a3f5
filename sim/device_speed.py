"""The serving GPU's speed against the GPU that measured the profile: another GPU of one kind.

A profile is fitted on one machine's grid. A GPU of the same kind can run the same steps at another
speed: a power cap, another clock, another memory. with_device_scale(model, s) prices every step's
device work (the fitted duration of a step the device bounds, and the device time alone of an
overlapped one) s times the profile's; launches, leads and host time keep the profile's (the host's
speed is sim.host_speed's).

Not measured by the held-out protocol: two lent H200 machines' grids agree within 1% on the
device time of decode graphs, prefill graphs and eager prefills, and a drain's steps over their
price at its host (experiments/fidelity/cause/host_scales.py, device_scale) run 2.4-4.3% long on
the grid's own machine, what sustained load costs (docs/host_speed.md, "The GPU's speed").
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
