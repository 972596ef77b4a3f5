"""Profiled cost model, overlapped steps: how long a step takes behind the one before it.

Overlapped steps (async scheduling): the engine launches step N+1 from the host while the device
still runs step N, so an eager step whose launches take longer than its device work (a small
prefill: ~20 ms of Python launches for Qwen3-0.6B against ~2 ms of kernels) is partly hidden
behind the step before it. A profile of an overlapping engine (harness.calibration.profiling) measures, per
shape, launch_s (host time of submit()) and gpu_s (device time alone), and a real run records
launch_s of every step; then two more fits per regime, "launch:<regime>" and "gpu:<regime>", and
step_time() prices an eager step as max(gpu + max(0, lead - free), launch - free) and a prefill
graph step as gpu + max(0, lead - free), where free is the host time left free during the
previous step (its priced duration less its own launch time less launch_delay_s, the loop's own
work before it launches the next step: reading the previous result, update(), schedule(),
building the batch; fitted on real steps, harness.calibration.fit; 0 with nothing in flight) and
lead, a third fit ("lead:<regime>", from the profile's lead_s), the host time from submit() until
the device can run the step without waiting, measured as the time from submit() on an idle device
until the device finished the step, less its device time. A step after an idle gap pays its whole
lead; one behind a long step pays none. ProfiledCostModel.predict() does the same for a table in
step order with its previous_duration_s column (the measured duration of each row's predecessor;
without it a row is priced as the grid measured it, behind a repeat of itself: behind_itself).

The serving loop's own work between two submits (loop: reading a result, update(), schedule(),
recording; a server's hand-off), where priced (SimConfig.loop_s and loop_per_seq_s; 0 by default),
is host time each step pays beside its launches: a host-bound overlapped loop runs one step per
launch + loop, so a decode graph step cannot end before launch + loop - free and an eager step
before launch + loop - free, where free now leaves out the previous step's launch and loop. In
steady state that is period = max(device, launch + loop); with loop 0 every price is as before.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.profiled_regimes import DEVICE_PRICED_REGIMES, EAGER_REGIMES, MIN_DURATION_S

# a fitted part of the step's regime in seconds, by name: "gpu", "launch" or "lead" (0 where the
# profile did not measure it)
Part = Callable[[str], float]


def _free(previous: tuple[float, float] | None, launch_delay_s: float) -> float:
    """Host time left free during the previous step: its duration less its own host work (launch
    time, and the loop's work where priced) and the loop's launch_delay_s; 0 with nothing in flight."""
    return 0.0 if previous is None else max(0.0, previous[0] - previous[1] - launch_delay_s)


def overlapped_duration(regime: str, duration: float, part: Part, previous: tuple[float, float] | None,
                        launch_delay_s: float, other_host: bool, loop: float = 0.0) -> float:
    """A step of `regime` priced `duration` alone, from the previous step's end on the device to
    its own end.

    The host starts submitting it `free` seconds before the device is done with the previous
    step (that step's duration less its own launch time and the loop's launch_delay_s; 0 with
    nothing in flight). Its device work cannot start before its lead (host time from submit()
    until the device can run it without waiting: the batch built and uploaded, the first
    launches ahead) nor end before its launches do:
    max(gpu + max(0, lead - free), launch - free). A prefill graph step is launched in one
    call, so only its lead counts (DEVICE_PRICED_REGIMES). Decode graph steps keep the grid's
    duration of back-to-back repeats, which holds the grid host's launches; on another host
    (other_host: host_scale != 1 or a host_jitter, sim.host_speed) such a step also cannot end
    before that host's launches:
    max(duration, launch - free).
    loop: the serving loop's own host work before this step's submit (module docstring), which a
    decode graph step (on any host) and an eager step pay beside their launches:
    max(duration, launch + loop - free) and max(waited, launch + loop - free); previous then
    holds the previous step's launch + loop."""
    if (other_host or loop > 0) and regime == "decode_graph":
        return max(duration, part("launch") + loop - _free(previous, launch_delay_s))
    if regime not in DEVICE_PRICED_REGIMES and regime not in EAGER_REGIMES:
        return duration
    gpu, launch, lead = (part(name) for name in ("gpu", "launch", "lead"))
    if regime in DEVICE_PRICED_REGIMES and gpu <= 0:
        return duration
    free = _free(previous, launch_delay_s)
    waited = gpu + max(0.0, lead - free)
    if regime in DEVICE_PRICED_REGIMES:
        return waited
    return max(waited, launch + loop - free, MIN_DURATION_S)


def behind_itself(part: Part) -> tuple[float, float]:
    """(duration, launch) of a step's own predecessor in the grid's back-to-back repeats: with
    its lead hidden, the longer of its device time and its launches."""
    launch = part("launch")
    return max(part("gpu"), launch), launch
