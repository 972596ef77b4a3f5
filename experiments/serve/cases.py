"""bench_serve's cases: each workload at each load, with the requests its engine run builds (built
here, on the CPU, before any GPU work), at a rate of the workload's capacity."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from engine.core.request import Request
from harness.scripting import compose_run_config
from harness.workloads.build import build_workload

WORKLOADS = {"azure": ["workload=trace_azure_conv"], "mooncake": ["workload=mooncake"],
             "poisson": ["workload=poisson"]}


@dataclass
class Case:
    name: str
    load: float
    rate: float
    overrides: list[str]  # the workload's, at this load
    requests: list[Request]

    @property
    def tag(self) -> str:
        return case_tag(self.name, self.load)


def case_tag(name: str, load: float) -> str:
    """A case's name: its workload and its load in percent (azure_50)."""
    return f"{name}_{int(round(load * 100))}"


def case_tags(workloads: list[str], loads: list[float]) -> list[str]:
    """The names of the cases plan_cases makes, in its order."""
    return [case_tag(name, load) for name in workloads for load in loads]


def plan_cases(args: argparse.Namespace, engine: list[str]) -> list[Case]:
    """Each case's workload overrides and requests, as the engine's run builds them (built here, on
    the CPU: a missing trace or a bad setting stops the benchmark before any GPU work)."""
    cases = []
    for i, name in enumerate(args.workloads):
        count = args.num_requests[min(i, len(args.num_requests) - 1)]
        base = [*WORKLOADS[name], f"workload.num_requests={count}", *args.workload]
        if args.trace_dir is not None:
            base.append(f"workload.trace_dir={Path(args.trace_dir).resolve()}")
        capacity = args.capacities[name] or sim_capacity(args.sim, base)
        print(f"{name}: capacity {capacity:.2f} req/s", flush=True)
        for k, load in enumerate(args.loads):
            overrides = at_rate([*base, f"workload.seed={k}"], load * capacity, engine)
            rc = compose_run_config([*engine, *overrides])
            requests = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
            cases.append(Case(name, load, load * capacity, overrides, requests))
    return cases


def sim_capacity(sim: list[str], base: list[str]) -> float:
    from harness.run import run_once

    outcome = run_once(compose_run_config([*sim, *base, "workload.arrival=offline"]), progress=False)
    return float(outcome.summary.request_s)


def at_rate(overrides: list[str], rate: float, common: list[str]) -> list[str]:
    """The workload at `rate` requests/s: workload.rate for synthetic arrivals, workload.rate_scale
    for a trace (its own mean rate over these requests times the scale)."""
    rc = compose_run_config([*common, *overrides])
    if rc.workload.arrival != "trace":
        return [*overrides, f"workload.rate={rate:.6g}"]
    times = [r.arrival_time for r in build_workload(rc.workload, rc.scheduler.max_model_len,
                                                    rc.model.vocab_size).requests]
    natural = (len(times) - 1) / max(max(times) - min(times), 1e-9)
    return [*overrides, f"workload.rate_scale={rate / natural:.6g}"]
