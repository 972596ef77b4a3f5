"""`run_disagg.py measure`: the fidelity cells. For each fleet (P prefill + D decode replicas, then
P + D aggregated replicas), started once on the GPUs and serving run after run:

  for each workload class: a small offline warm-up (unmeasured: a class's first run meets new
  shapes), then the offline drain (its request throughput is the fleet's capacity for the class,
  and a cell of its own), then Poisson arrivals at each load x that capacity.

Every measured run is simulated with the same requests, the measured fleet's KV blocks per
replica, and the GPU's profiled cost model; disaggregated runs price the KV transfer with the
hardware's NVLink figures and the engine's handshake (replicas act on transfer messages between
their steps: fleet.transfer.handshake). Once the disaggregated fleet is done, the link's effective bandwidth
and latency are fitted to its measured transfers (tables.fit_link) and its cells simulated again
with them ("+ fitted link"): calibration, in-sample, reported beside the priced figures.
With keep_steps (--keep-steps), each cell's per-replica steps of the measured run and of its
priced simulation go to steps_<fleet>_<workload>_<load>.csv.gz (experiments/disagg/kept_steps.py).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments.disagg.common import ROUTER, Deadline, Setup, log
from experiments.disagg.kept_steps import STEP_COLUMNS as KEPT_STEP_COLUMNS
from experiments.disagg.kept_steps import write_kept
from experiments.disagg.tables import Book, fit_link
from experiments.disagg.workloads import MEASURE_SCHEDULER, at_rate, class_workload, request_count
from harness.config import RunConfig
from harness.fidelity.fleet_interval import PoolPricing, fleet_with_interval
from harness.fleet.config import replica_run_configs
from harness.fleet.disagg import disagg_server, run_disagg_once
from harness.fleet.disagg_config import pool_run_configs
from harness.fleet.run import fleet_server, run_fleet_once
from harness.output.metrics import SUMMARY_STEP_COLUMNS
from sim.interval import IntervalConfig
from sim.kv_transfer import TransferConfig, link_figures

MODES = ("disaggregated", "aggregated")
SLACK_S = 5.0  # a run's start and tail beyond its arrivals


@dataclass(frozen=True)
class MeasureConfig:
    workloads: tuple[str, ...]
    loads: tuple[float, ...]
    cell_s: float  # a loaded cell's arrivals span about this long
    min_requests: int
    max_requests: int
    drain_requests: int  # the offline drain's requests at least; more where the fleet drains them faster
    drain_s: float  # a drain long enough for this many seconds (simulated) has at most max_drain requests
    max_drain: int
    warmup_requests: int
    trace: str | None
    session_s: float  # what starting a fleet needs at least (loading, graph capture)
    keep_steps: bool = False  # every run's per-replica steps, both sides (experiments/disagg/kept_steps.py)

    @property
    def step_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*SUMMARY_STEP_COLUMNS, *KEPT_STEP_COLUMNS))) if self.keep_steps \
            else SUMMARY_STEP_COLUMNS


@contextmanager
def open_fleet(setup: Setup, rc: RunConfig, mode: str, step_columns: tuple[str, ...] = SUMMARY_STEP_COLUMNS):
    """serve(workload) -> outcome, on the measured fleet of `mode`, started once."""
    server = disagg_server if mode == "disaggregated" else fleet_server
    with server(rc, setup.measured_fleet(mode), ROUTER, False, step_columns) as serve:  # type: ignore[arg-type]
        yield serve


def replica_blocks(outcome) -> int:
    """KV blocks per replica of a measured run (a disaggregated fleet: its decode replicas')."""
    pools = getattr(outcome, "pool_blocks", None)
    return min(pools["decode"]) if pools is not None else min(outcome.replica_blocks)


def simulate(setup: Setup, sim_rc: RunConfig, mode: str, workload, num_blocks: int,
             link: TransferConfig | None = None, step_columns: tuple[str, ...] = SUMMARY_STEP_COLUMNS,
             pricing: PoolPricing | None = None):
    """The cell simulated: sim_rc on `mode`'s fleet with workload and num_blocks a replica; pricing:
    each replica's cost model (an interval's draw, harness.fidelity.fleet_interval)."""
    rc = _cell_rc(sim_rc, workload, num_blocks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a profile extrapolated past its grid says so once per run
        if mode == "disaggregated":
            return run_disagg_once(rc, setup.fleet(mode, link), ROUTER, False, step_columns,  # type: ignore[arg-type]
                                   pricing)
        return run_fleet_once(rc, setup.fleet(mode), ROUTER, False, step_columns=step_columns,  # type: ignore[arg-type]
                              pricing=pricing)


def simulate_with_interval(setup: Setup, sim_rc: RunConfig, mode: str, workload, num_blocks: int,
                           interval: IntervalConfig, step_columns: tuple[str, ...] = SUMMARY_STEP_COLUMNS):
    """simulate()'s outcome, its summary with the latencies' prediction intervals (a pool's machines
    drawn together: harness.fidelity.fleet_interval)."""
    rc = _cell_rc(sim_rc, workload, num_blocks)
    fleet = setup.fleet(mode)
    pools = (pool_run_configs(rc, fleet) if mode == "disaggregated"  # type: ignore[arg-type]
             else replica_run_configs(rc, fleet)[:1])  # type: ignore[arg-type]

    def run(pricing: PoolPricing | None, label: str):
        columns = step_columns if pricing is None else SUMMARY_STEP_COLUMNS  # a draw: its summary alone
        return simulate(setup, sim_rc, mode, workload, num_blocks, step_columns=columns, pricing=pricing)

    return fleet_with_interval(rc, interval, pools, run)


def _cell_rc(sim_rc: RunConfig, workload, num_blocks: int) -> RunConfig:
    cache = dataclasses.replace(sim_rc.cache, num_blocks=num_blocks)
    return dataclasses.replace(sim_rc, workload=workload, cache=cache)


class Cells:
    def __init__(self, setup: Setup, mc: MeasureConfig, out: Path, deadline: Deadline) -> None:
        self.setup, self.mc, self.deadline = setup, mc, deadline
        self.book = Book(out)
        scheduler = () if setup.cpu else MEASURE_SCHEDULER
        self.measured_rc = setup.run_config("measured", scheduler)
        self.sim_rc = setup.run_config("sim", scheduler)
        self.classes = {name: class_workload(name, mc.trace, setup.cpu) for name in mc.workloads}
        self.served: list[tuple[dict, object, int, dict]] = []  # disaggregated cells: cell, workload, blocks, row
        self.sim_side = "profiled" if setup.profile else "roofline"  # the simulated side's cost model

    def run(self) -> Book:
        for mode in MODES:
            if not self.deadline.fits(self.mc.session_s):
                self.book.note(f"{mode}: not started, {self.deadline.elapsed():.0f} s of the call spent")
                continue
            log(self.deadline, f"starting the {self.setup.fleet_label(mode)} {mode} fleet")
            with open_fleet(self.setup, self.measured_rc, mode, self.mc.step_columns) as serve:
                log(self.deadline, "fleet ready")
                for name, base in self.classes.items():
                    self._serve_class(serve, mode, name, base)
            if mode == "disaggregated" and self.served:
                self._calibrate()
        return self.book

    def _serve_class(self, serve, mode: str, name: str, base) -> None:
        mc = self.mc
        blocks = replica_blocks(serve(at_rate(base, None, mc.warmup_requests)))
        # NOTE a drain's throughput (requests / makespan) undercounts capacity by its tail (the last
        # long outputs decoding alone), so a fleet that drains fast gets more requests
        pilot = simulate(self.setup, self.sim_rc, mode, at_rate(base, None, mc.drain_requests), blocks)
        n = request_count(pilot.summary["request_s"], mc.drain_s, mc.drain_requests, mc.max_drain)
        capacity = self._cell(serve, mode, name, "offline", None, n, base, blocks)
        if capacity is None:
            return
        for load in mc.loads:
            rate = load * capacity
            n = request_count(rate, mc.cell_s, mc.min_requests, mc.max_requests)
            self._cell(serve, mode, name, f"{load:g}", rate, n, base, blocks)

    def _cell(self, serve, mode: str, name: str, load: str, rate: float | None, n: int, base,
              blocks: int) -> float | None:
        """Serve and simulate one cell; the measured request throughput, or None when skipped."""
        workload = at_rate(base, rate, n)
        sim = simulate(self.setup, self.sim_rc, mode, workload, blocks, step_columns=self.mc.step_columns)
        estimate = 1.5 * max(sim.summary["makespan_s"], n / rate if rate else 0.0) + SLACK_S
        cell = {"fleet": self.setup.fleet_label(mode), "mode": mode, "workload": name, "load": load,
                "rate_req_s": rate if rate is not None else float("nan"), "num_requests": n}
        if not self.deadline.fits(estimate):
            self.book.note(f"{cell['fleet']} {name} {load}: skipped, about {estimate:.0f} s would pass the limit")
            return None
        measured = serve(workload)
        row, sim_row = measured.summary.to_row(), sim.summary.to_row()
        self.book.run("measured", cell, row)
        self.book.run(self.sim_side, cell, sim_row)
        if self.mc.keep_steps:
            write_kept(self.book.out, cell, {"measured": measured, self.sim_side: sim}, self.sim_rc.cache.block_size)
        compared = self.book.compare(cell, row, sim_row, self.sim_side)
        if mode == "disaggregated":
            self.book.moved(cell, measured.requests)
            self.served.append((cell, workload, blocks, row))
        errors = ", ".join(f"{r['metric']} {100 * r['rel_error']:+.1f}%" for r in compared)
        log(self.deadline, f"{cell['fleet']} {name} {load} ({row['request_s']:.2f} req/s served, {n} requests): "
                           f"{errors}")
        return float(row["request_s"])

    def _calibrate(self) -> None:
        """The link fitted to the measured transfers; the disaggregated cells simulated with it."""
        transfers = pd.concat(self.book.transfers, ignore_index=True)
        if transfers.empty:
            return
        hardware = self.sim_rc.hardware
        bandwidth, latency = link_figures(self.setup.link(), hardware, hardware)
        fit = fit_link(transfers, bandwidth)
        priced = latency + transfers["transfer_bytes"] / bandwidth
        fit.update({"priced_bandwidth": bandwidth, "priced_latency_s": latency,
                    "priced_p50_s": float(priced.median())})
        pd.DataFrame([fit]).to_csv(self.book.out / "transfer_fit.csv", index=False)
        log(self.deadline, f"KV link: measured median transfer {1e3 * fit['measured_p50_s']:.3f} ms against "
                           f"{1e3 * fit['priced_p50_s']:.3f} ms priced; fitted {fit['bandwidth'] / 1e9:.1f} GB/s + "
                           f"{1e6 * fit['latency_s']:.0f} us")
        link = fitted_link(self.setup, fit["bandwidth"], fit["latency_s"])
        for cell, workload, blocks, row in self.served:
            sim_row = simulate(self.setup, self.sim_rc, "disaggregated", workload, blocks, link).summary.to_row()
            side = f"{self.sim_side} + fitted link"
            self.book.run(side, cell, sim_row)
            self.book.compare(cell, row, sim_row, side)


def fitted_link(setup: Setup, bandwidth: float, latency_s: float) -> TransferConfig:
    """The link fitted to the measured transfers, step waits and all: priced without the handshake, the
    queue behind the prefill step and the receive's side, which would count those waits twice."""
    return TransferConfig(link=setup.link().link, bandwidth=bandwidth, latency_s=latency_s)


def write_settings(out: Path, **settings) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps(settings, indent=2, default=str) + "\n")
