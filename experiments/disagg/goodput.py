"""`run_disagg.py goodput`: the engine's confirmation of the planner's direction
(experiments/disagg/planning.py).

A scenario's goodput on a fleet is the highest Poisson rate at which 90% of requests meet
both SLOs (TTFT <= ttft_s and TPOT <= tpot_s; a one-token request has no TPOT). The simulator
finds each mode's by bisection (cheap); the engine then serves each mode a short ladder around
its simulated goodput (0.8x and 1.2x), ascending until a rate fails, with a rung of half the
rate below when the first fails and one of 1.5x above when the last passes (two at most each
way), on P + D GPUs both ways. The runs bracket each measured goodput in [lo, hi); the direction
is settled when the intervals separate (one mode's lo at least the other's hi). Until they do,
each fleet (the second right after its ladder, then each in turn again, a fleet start each visit)
serves the rates that can separate them: the other mode's bounds that lie inside its own interval
(passing the other's hi proves it wins; failing the other's lo proves it loses), else its own
interval's midpoint (bisection), until --limit-s is spent or the overlap is narrower than
TIE_SHARE of its rate (a tie at this resolution).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.cells import MODES, open_fleet, replica_blocks, simulate
from experiments.disagg.common import Deadline, Setup, log
from experiments.disagg.workloads import (
    CPU_LENGTH_SCALE,
    GOODPUT_MAX_MODEL_LEN,
    GOODPUT_SCHEDULER,
    Scenario,
    request_count,
)
from harness.compare.tables import markdown

ATTAINMENT = 0.9
LADDER = (0.8, 1.2)
TIE_SHARE = 0.05  # intervals overlapping over less than this share of the rate: a tie
FIRST_START_S = 60.0  # a fleet's start and warm-up, until the call has timed one


def attainment(requests: pd.DataFrame, scenario: Scenario) -> float:
    """Share of requests meeting both SLOs."""
    tpot_ok = requests["tpot"].isna() | (requests["tpot"] <= scenario.tpot_s)
    return float(((requests["ttft"] <= scenario.ttft_s) & tpot_ok).mean())


def scheduler_overrides(setup: Setup) -> tuple[str, ...]:
    return GOODPUT_SCHEDULER if setup.cpu else GOODPUT_SCHEDULER + GOODPUT_MAX_MODEL_LEN


class Ladder:
    def __init__(self, setup: Setup, scenarios: tuple[Scenario, ...], out: Path, deadline: Deadline,
                 run_s: float, min_requests: int, max_requests: int, warmup_requests: int) -> None:
        self.setup, self.scenarios, self.out, self.deadline = setup, scenarios, out, deadline
        self.run_s, self.min_requests, self.max_requests = run_s, min_requests, max_requests
        self.warmup_requests = warmup_requests
        self.scale = CPU_LENGTH_SCALE if setup.cpu else 1.0
        self.measured_rc = setup.run_config("measured", scheduler_overrides(setup))
        self.sim_rc = setup.run_config("sim", scheduler_overrides(setup))
        self.runs: list[dict] = []
        self.sim_goodput: dict[tuple[str, str], float] = {}
        self.blocks = 0
        self.start_s, self.timed = FIRST_START_S, False  # the longest fleet start and warm-up timed
        self.opened_s: float | None = None

    def workload(self, scenario: Scenario, rate: float):
        n = request_count(rate, self.run_s, self.min_requests, self.max_requests)
        return scenario.workload(rate, n, self.scale)

    def sim_attainment(self, scenario: Scenario, mode: str, rate: float) -> tuple[float, object]:
        outcome = simulate(self.setup, self.sim_rc, mode, self.workload(scenario, rate), self.blocks)
        return attainment(outcome.requests, scenario), outcome

    def find_sim_goodput(self, scenario: Scenario, mode: str, rel_tol: float = 0.03) -> float:
        """Bisection on the simulator: the highest rate whose attainment is >= 90%."""
        low, high = 0.0, scenario.rate
        while self.sim_attainment(scenario, mode, high)[0] >= ATTAINMENT and high < 64 * scenario.rate:
            low, high = high, 2 * high
        if low == 0.0:
            while high > scenario.rate / 64 and self.sim_attainment(scenario, mode, high / 2)[0] < ATTAINMENT:
                high /= 2
            low = high / 2
        while (high - low) > rel_tol * high:
            middle = (low + high) / 2
            passes = self.sim_attainment(scenario, mode, middle)[0] >= ATTAINMENT
            low, high = (middle, high) if passes else (low, middle)
        return low

    def rates(self, scenario: Scenario, mode: str) -> list[float]:
        """The mode's ladder: LADDER x its simulated goodput (the planner's rate where that is 0)."""
        goodput = self.sim_goodput[(scenario.name, mode)]
        return [round(f * goodput, 3) for f in LADDER] if goodput > 0 else [scenario.rate]

    def run(self) -> pd.DataFrame:
        for mode in MODES:
            if not self.deadline.fits(30.0):
                log(self.deadline, f"{mode}: not started, out of time")
                continue
            with self._fleet(mode) as serve:
                for scenario in self.scenarios:
                    self._warm(serve, scenario)
                    if (scenario.name, mode) not in self.sim_goodput:
                        for m in MODES:
                            self.sim_goodput[(scenario.name, m)] = self.find_sim_goodput(scenario, m)
                    self._climb(serve, scenario, mode)
                    self._settle(serve, scenario, mode)
        self._settle_visits()
        for scenario in self.scenarios:
            log(self.deadline, f"{scenario.name}: {self.settled(scenario) or 'unresolved (out of time)'}")
        return self.summary()

    def _settle_visits(self) -> None:
        """Each fleet in turn again while a scenario's intervals overlap and a visit fits the budget."""
        while True:
            progressed = False
            for mode in MODES:
                open_ = [s for s in self.scenarios if self.settled(s) is None]
                if not open_:
                    return
                if not self.deadline.fits(self.start_s + 30.0):
                    log(self.deadline, f"{mode}: no settling visit, out of time")
                    return
                runs = len(self.runs)
                with self._fleet(mode) as serve:
                    for scenario in open_:
                        self._warm(serve, scenario)
                        self._settle(serve, scenario, mode)
                progressed = progressed or len(self.runs) > runs
            if not progressed:
                return

    @contextlib.contextmanager
    def _fleet(self, mode: str):
        log(self.deadline, f"starting the {self.setup.fleet_label(mode)} {mode} fleet")
        self.opened_s = self.deadline.elapsed()
        with open_fleet(self.setup, self.measured_rc, mode) as serve:
            yield serve

    def _warm(self, serve, scenario: Scenario) -> None:
        warm = dataclasses.replace(self.workload(scenario, scenario.rate), arrival="offline", rate=None,
                                   num_requests=self.warmup_requests)
        self.blocks = replica_blocks(serve(warm))
        if self.opened_s is not None:  # the fleet's first warm-up: its start is timed
            self.start_s = max(self.start_s if self.timed else 0.0, self.deadline.elapsed() - self.opened_s)
            self.timed, self.opened_s = True, None

    def interval(self, scenario: Scenario, mode: str) -> tuple[float, float]:
        runs = pd.DataFrame(self.runs)
        if runs.empty:
            return math.nan, math.nan
        return measured_goodput(runs[(runs["scenario"] == scenario.name) & (runs["mode"] == mode)])

    def settled(self, scenario: Scenario) -> str | None:
        """The mode whose measured goodput interval lies above the other's, "tie" where they overlap
        over less than TIE_SHARE of the rate, else None (both fleets need runs)."""
        (lo_d, hi_d), (lo_a, hi_a) = (self.interval(scenario, m) for m in MODES)
        if math.isnan(lo_d) or math.isnan(lo_a):
            return None
        for mode, lo, other_hi in ((MODES[0], lo_d, hi_a), (MODES[1], lo_a, hi_d)):
            if lo >= other_hi:
                return mode
        low, high = max(lo_d, lo_a), min(hi_d, hi_a)
        return f"tie within {100 * TIE_SHARE:g}%" if high - low <= TIE_SHARE * high else None

    def next_rate(self, scenario: Scenario, mode: str, bisect: bool) -> float | None:
        """The rate that can separate the mode's interval from the other's: the other's hi, then its
        lo, where inside this mode's interval; else (bisect) this interval's midpoint; None when
        nothing new is left to try."""
        other = MODES[1 - MODES.index(mode)]
        lo, hi = self.interval(scenario, mode)
        other_lo, other_hi = self.interval(scenario, other)
        for rate in (other_hi, other_lo):
            if lo < rate < hi and math.isfinite(rate):
                return rate
        if not bisect:
            return None
        rate = round((lo + hi) / 2 if math.isfinite(hi) else 1.5 * lo, 3)
        return rate if lo < rate < hi else None

    def _settle(self, serve, scenario: Scenario, mode: str) -> None:
        """Serve the mode the rates that can separate it from the other mode, until they separate
        or one bisection step has run (the other fleet's next visit tests the new bounds)."""
        other = MODES[1 - MODES.index(mode)]
        if math.isnan(self.interval(scenario, other)[0]):
            return  # the other mode has no runs yet
        bisected = False
        while self.settled(scenario) is None:
            rate = self.next_rate(scenario, mode, bisect=not bisected)
            if rate is None:
                return
            bisected = bisected or rate not in self.interval(scenario, other)
            if self._serve(serve, scenario, mode, rate) is None:
                return

    def _climb(self, serve, scenario: Scenario, mode: str) -> None:
        """The mode's ladder ascending until a rate fails; below it by halves when its first rate
        fails, above it by 1.5x when its last passes (two rungs at most either way)."""
        rates = self.rates(scenario, mode)
        first = self._serve(serve, scenario, mode, rates[0])
        if first is None:
            return
        step, rate = (0.5, rates[0]) if not first else (1.5, rates[-1])
        if first:
            for rate in rates[1:]:
                if not self._serve(serve, scenario, mode, rate):
                    return
        for _ in range(2):
            rate = round(step * rate, 3)
            ok = self._serve(serve, scenario, mode, rate)
            if ok is None or ok != first:  # out of time, or the edge is found
                return

    def _serve(self, serve, scenario: Scenario, mode: str, rate: float) -> bool | None:
        workload = self.workload(scenario, rate)
        estimate = 1.5 * workload.num_requests / rate + 10.0
        if not self.deadline.fits(estimate):
            log(self.deadline, f"{scenario.name} {mode} {rate:g} req/s: skipped, out of time")
            return None
        outcome = serve(workload)
        measured = attainment(outcome.requests, scenario)
        predicted, sim = self.sim_attainment(scenario, mode, rate)
        row, sim_row = outcome.summary.to_row(), sim.summary.to_row()
        self.runs.append({"scenario": scenario.name, "mode": mode, "fleet": self.setup.fleet_label(mode),
                          "rate_req_s": rate, "num_requests": workload.num_requests, "attainment": measured,
                          "sim_attainment": predicted, "makespan_s": row["makespan_s"],
                          **{f"{k}": row[k] for k in ("ttft_p90_s", "tpot_p90_s")},
                          **{f"sim_{k}": sim_row[k] for k in ("ttft_p90_s", "tpot_p90_s")}})
        pd.DataFrame(self.runs).to_csv(self.out / "goodput_runs.csv", index=False)
        log(self.deadline, f"{scenario.name} {self.setup.fleet_label(mode)} {rate:g} req/s: {100 * measured:.0f}% meet "
                           f"the SLO (simulated {100 * predicted:.0f}%)")
        self.summary()
        return measured >= ATTAINMENT

    def summary(self) -> pd.DataFrame:
        """Each scenario and mode: the simulated goodput, and the measured one as the interval
        [goodput_lo, goodput_hi) the runs bracket it in (measured_goodput)."""
        rows = []
        runs = pd.DataFrame(self.runs)
        for scenario in self.scenarios:
            for mode in MODES:
                mine = runs[(runs["scenario"] == scenario.name) & (runs["mode"] == mode)] if len(runs) else runs
                low, high = measured_goodput(mine)
                rows.append({"scenario": scenario.name, "mode": mode, "fleet": self.setup.fleet_label(mode),
                             "ttft_slo_s": scenario.ttft_s, "tpot_slo_s": scenario.tpot_s,
                             "sim_goodput_req_s": self.sim_goodput.get((scenario.name, mode), math.nan),
                             "goodput_lo_req_s": low, "goodput_hi_req_s": high, "rates_tried": len(mine),
                             "settled": self.settled(scenario) or "unresolved"})
        table = pd.DataFrame(rows)
        table.to_csv(self.out / "goodput.csv", index=False)
        (self.out / "goodput.md").write_text(markdown(table) + "\n")
        return table


def measured_goodput(runs: pd.DataFrame) -> tuple[float, float]:
    """[lo, hi): the goodput lies at or above lo, the highest rate passing below the first failing
    one (0 when the lowest rate tried fails), and below hi, that first failing rate (inf when
    none fails); (nan, nan) without runs."""
    if runs.empty:
        return math.nan, math.nan
    ordered = runs.sort_values("rate_req_s")
    ok = (ordered["attainment"] >= ATTAINMENT).to_numpy()
    rates = ordered["rate_req_s"].to_numpy(dtype=float)
    first_fail = int(np.argmin(ok)) if not ok.all() else len(ok)
    low = float(rates[first_fail - 1]) if first_fail > 0 else 0.0
    return low, float(rates[first_fail]) if first_fail < len(ok) else math.inf
