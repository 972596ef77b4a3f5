"""A GPU at its power limit: its steps slow with the prefill it has just run.

A profiling grid times each step shape in a short burst, so a profile prices every step at the
clock of a GPU that has been idle. Under sustained prefill a GPU draws up to its power limit
(700 W on the H100 SXM and the H200 SXM) and then lowers its clock, and every step slows: on one
H200 serving Qwen3-0.6B, past about 670 W the SM clock fell from 1,935 to 1,680 MHz, a six-prompt
eager prefill ran up to 8.7% longer and the decode steps between prefills 5.6%
(experiments/fidelity/prefill_rate_h200, `experiments/fidelity/prefill_rate_probe.py`). Served
code_completion prefill graphs ran 1.00-1.03x their price under 150 k prefill tokens a second and
1.05-1.07x at 300-400 k (experiments/fidelity/cause/prefill_load.py on
experiments/fidelity/code_completion_h200_r4 and _r5).

A PowerCurve is that probe's measure for one model on one GPU: the prefill tokens a second the GPU
computed (a steady mix of prefill and decode steps), and how much longer a prefill step and a
decode step then took than at the lightest mix. The draw follows the work a token is (the 8B
reaches the limit at a tenth of the 0.6B's rate), so a curve belongs to a model and a GPU:
profiles/<hardware>/<model>.power.json. It prices another GPU of the same die under the same board
limit (the curve records both; HardwareSpec.chip, power_limit_w): the H200 SXM's curves price the
H100 SXM, a GH100 at 700 W too, whose SMs run a token's matmuls at the same clock for the same
draw (the H200's HBM3e moves more bytes a second, which prefill does not wait on).

PowerLimit applies it in the simulator (SimConfig.power_curve): before each step it reads the
prefill tokens of the steps that ended within the curve's window before the step's start, as a
rate, and the cost model prices the step's device work (sim.profiled: the fitted duration of a step
the device bounds, the device time alone of an overlapped one) that many times longer: a step with
prefill by the prefill column, a decode-only step by the decode column, linear between the
curve's points and flat past its ends. Launches, leads and host time keep the profile's: the host's
clock does not move with the GPU's.

The steps are timed on the device's own line: a step starts when the one before it ended, or at
the loop's clock after an idle gap (the executor reads the replica's clock: follow_clock). A
fast-forwarded run of decode steps (engine.core.fast_forward) is priced one step at a time through
the same state, and since the loop's clock never runs ahead of the device's line while steps are
queued, both paths price the same steps at the same rates, bit for bit.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from sim.specs import HardwareSpec

CURVE_FIELDS = ("hardware", "model", "window_s", "prefill_tokens_per_s", "prefill_scale", "decode_scale", "command")
GPU_FIELDS = ("chip", "power_limit_w")  # optional: where absent, the curve prices its own GPU alone


class Clock(Protocol):
    def now(self) -> float: ...


@dataclass(frozen=True)
class PowerCurve:
    """How much longer a step takes against the prefill tokens a second of the recent window
    (module docstring). hardware, model: the conf names it was measured for (a HardwareSpec's and a
    ModelSpec's name); the three columns are at the same points, rates ascending. chip,
    power_limit_w: that GPU's die and board limit (W), None where not recorded."""

    hardware: str
    model: str
    window_s: float
    prefill_tokens_per_s: tuple[float, ...]
    prefill_scale: tuple[float, ...]
    decode_scale: tuple[float, ...]
    command: str = ""
    chip: str | None = None
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.window_s, (int, float)) and 0 < self.window_s < math.inf):
            raise ValueError(f"PowerCurve.window_s must be a number of seconds > 0, got {self.window_s!r}")
        rates = self.prefill_tokens_per_s
        if not rates or any(not 0 <= r < math.inf for r in rates) or any(b <= a for a, b in zip(rates, rates[1:])):
            raise ValueError(f"PowerCurve.prefill_tokens_per_s must be ascending rates >= 0, got {list(rates)}")
        for name in ("prefill_scale", "decode_scale"):
            column = getattr(self, name)
            if len(column) != len(rates) or any(not 0 < s < math.inf for s in column):
                raise ValueError(f"PowerCurve.{name} must hold {len(rates)} factors > 0 (one a rate), "
                                 f"got {list(column)}")

    def prices(self, hardware: HardwareSpec) -> bool:
        """Whether the curve holds on this GPU: the one it was measured on, or one of the same
        die under the same board limit (module docstring)."""
        if hardware.name == self.hardware:
            return True
        return (self.chip is not None and self.power_limit_w is not None
                and (hardware.chip, hardware.power_limit_w) == (self.chip, self.power_limit_w))

    def scale(self, rate: float, prefill: bool) -> float:
        """The step's device work against the profile's at this prefill rate (tokens/s)."""
        column = self.prefill_scale if prefill else self.decode_scale
        return float(np.interp(rate, self.prefill_tokens_per_s, column))


def read_power_curve(path: str | Path) -> PowerCurve:
    """The PowerCurve a JSON file holds (CURVE_FIELDS); a one-line ValueError naming the file where
    it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a power curve ({error})") from None
    missing = [k for k in CURVE_FIELDS if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path}: a power curve needs {missing}")
    try:
        rates, prefill, decode = (tuple(float(x) for x in data[k]) for k in CURVE_FIELDS[3:6])
        chip, limit = (data.get(k) for k in GPU_FIELDS)
        return PowerCurve(str(data["hardware"]), str(data["model"]), float(data["window_s"]), rates, prefill, decode,
                          str(data["command"]), None if chip is None else str(chip),
                          None if limit is None else float(limit))
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path}: {error}") from None


class PowerLimit:
    """The device's line of steps and the prefill tokens of its recent window (module docstring):
    scale_for() before a step is priced, ran() with its duration once it is."""

    def __init__(self, curve: PowerCurve) -> None:
        self.curve = curve
        self.clock: Clock | None = None
        self._end = 0.0  # when the device's last step ends
        self._start = 0.0  # when the step being priced starts
        self._recent: deque[tuple[float, int]] = deque()  # (end, prefill tokens) of steps in the window
        self._tokens = 0

    def scale_for(self, prefill_tokens: int, queued: bool = False) -> float:
        """The factor of the next step's device work. queued: it follows the step before on the
        device whatever the clock says (a fast-forwarded repeat); else it starts no earlier than
        the loop's clock."""
        start = self._end
        if not queued and self.clock is not None:
            start = max(start, self.clock.now())
        self._start = start
        recent, horizon = self._recent, start - self.curve.window_s
        while recent and recent[0][0] <= horizon:
            self._tokens -= recent.popleft()[1]
        return self.curve.scale(self._tokens / self.curve.window_s, prefill_tokens > 0)

    def ran(self, duration_s: float, prefill_tokens: int) -> None:
        """The step just priced takes duration_s (all the device is held for it)."""
        self._end = self._start + duration_s
        if prefill_tokens:
            self._recent.append((self._end, prefill_tokens))
            self._tokens += prefill_tokens

    def repeats(self, prices: Iterator[float], cost_model: object) -> Iterator[float]:
        """prices of a fast-forwarded run's decode repeats (an iterator that prices each when
        asked), each priced at its own rate on cost_model (its power_scale) and recorded."""
        while True:
            cost_model.power_scale = self.scale_for(0, queued=True)  # type: ignore[attr-defined]
            price = next(prices)
            cost_model.power_scale = 1.0  # type: ignore[attr-defined]
            self.ran(price, 0)
            yield price
