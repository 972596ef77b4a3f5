"""Evaluating deployments for the deployment search (harness.plan.search): one simulation per
deployment, one plan.csv row each.

evaluate_all() is the single place where deployments are evaluated: a parallel map can be passed in
there (default: serial). Deployments that are the same simulation (simulation_key: one replica,
any router) are simulated once; their rows are identical but for eval_s (0 for the copies).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial

from engine.core.routers import RouterConfig
from harness.config import RunConfig, on_hardware
from harness.fleet.config import FleetConfig
from harness.fleet.run import run_fleet_once
from harness.output.metrics import SUMMARY_STEP_COLUMNS
from harness.plan.config import SLOConfig
from harness.plan.placement import with_expert_parallel
from harness.plan.row import Deployment, PlanMeasures, PlanRow, hourly_cost
from harness.run import cyclic_gc_paused
from harness.workloads import fit_warnings_muted
from harness.workloads.prepared import Drawn, PreparedWorkload


@dataclass(frozen=True)
class PlanBase:
    """What every evaluation shares (picklable, for a parallel map)."""

    rc: RunConfig
    catalogue: dict
    slo: SLOConfig
    router: RouterConfig  # prefix_affinity's parameters; the name comes from the deployment

    def cost_per_hour(self, d: Deployment) -> float:
        return hourly_cost((self.catalogue[d.hardware].price_per_gpu_hour, d.tp_size * d.replicas))

    @cached_property
    def prepared(self) -> PreparedWorkload | None:
        """The workload's requests, made once for every deployment (harness.workloads.prepared):
        built on first use in this process; None without a simulator's run config (then each
        evaluation builds its own). A copy of the base sent to another process leaves them behind
        (they are large and quick to make again); a forked one inherits them."""
        rc = self.rc
        if getattr(rc, "sim", None) is None:
            return None
        vocab = rc.model.vocab_size if rc.sim.vocab_size is None else rc.sim.vocab_size
        drawn = Drawn(rc.workload, rc.scheduler.max_model_len, vocab, rc.cache.block_size)
        return PreparedWorkload(drawn, rc.sim.execution.seed, rc.sim.eos_token_id)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "prepared"}


def evaluate(deployment: Deployment, base: PlanBase) -> PlanRow:
    """Simulate one deployment on the workload; one plan.csv row."""
    d = deployment
    started = time.perf_counter()
    try:
        scheduler = dataclasses.replace(base.rc.scheduler, policy=d.policy, max_num_seqs=d.max_num_seqs,
                                        max_num_batched_tokens=d.max_num_batched_tokens)
        rc = on_hardware(with_expert_parallel(dataclasses.replace(base.rc, scheduler=scheduler),
                                              bool(d.expert_parallel)), base.catalogue[d.hardware])
        # The whole evaluation without the cycle collector (harness.run.cyclic_gc_paused): its requests
        # and steps are freed before the collector runs again, so it never scans them. Every
        # deployment serves the same requests at the same max_model_len: run_plan reports their
        # fit once, not once per deployment.
        with cyclic_gc_paused(), fit_warnings_muted():
            outcome = run_fleet_once(rc, FleetConfig(d.replicas, d.tp_size),
                                     dataclasses.replace(base.router, name=d.router), progress=False,
                                     step_columns=SUMMARY_STEP_COLUMNS, keep_steps=False, prepared=base.prepared)
    except (ValueError, TypeError) as error:  # e.g. the model does not fit this hardware at this TP
        return PlanRow(d, base.cost_per_hour(d), slo_ratio=math.inf, meets_slo=False,
                       error=str(error).splitlines()[0], eval_s=time.perf_counter() - started)
    s = outcome.summary
    measures = PlanMeasures(
        ttft_p50_s=s.ttft_p50_s, ttft_p90_s=s.ttft_p90_s, ttft_p99_s=s.ttft_p99_s,
        tpot_p50_s=s.tpot_p50_s, tpot_p90_s=s.tpot_p90_s, tpot_p99_s=s.tpot_p99_s,
        e2e_p50_s=s.e2e_p50_s, e2e_p90_s=s.e2e_p90_s, e2e_p99_s=s.e2e_p99_s,
        output_tok_s=s.output_tok_s, request_s=s.request_s, num_rejected=s.labels.num_rejected)
    ratio = max(s.ttft_p90_s / base.slo.ttft_p90_s, s.tpot_p90_s / base.slo.tpot_p90_s)
    ratio = ratio if math.isfinite(ratio) else math.inf
    meets = bool(ratio <= 1.0 and measures.num_rejected == 0)
    return PlanRow(d, base.cost_per_hour(d), slo_ratio=ratio, meets_slo=meets, error="",
                   eval_s=time.perf_counter() - started, measures=measures)


def evaluate_all(deployments: list[Deployment], base: PlanBase, mapper: Callable = map) -> list[PlanRow]:
    """The one place deployments are evaluated; mapper(fn, items) may be a parallel map. Deployments
    with the same simulation_key are simulated once: the others get that row (eval_s 0). The
    simulations go to the mapper longest first (expected_work), so that workers taking them in
    turn finish together; the workload's requests are made before (PlanBase.prepared), so that
    forked workers inherit them."""
    first: dict[Deployment, int] = {}  # simulation key -> index of its first deployment
    for i, d in enumerate(deployments):
        first.setdefault(simulation_key(d), i)
    simulated = sorted(first.values(), key=lambda i: -expected_work(deployments[i]))
    if simulated:
        base.prepared  # noqa: B018 - made here, once, not in each worker
    rows = dict(zip(simulated, mapper(partial(evaluate, base=base), [deployments[i] for i in simulated])))
    return [rows[i] if i in rows else dataclasses.replace(rows[first[simulation_key(d)]], deployment=d, eval_s=0.0)
            for i, d in enumerate(deployments)]


def expected_work(d: Deployment) -> float:
    """A deployment's simulation time relative to others' (the order evaluate_all hands them out
    in), fitted to the CPU time of each simulation of experiments/bench_plan_speed.py's grid:
    least_tokens routing settles booked decode runs at every arrival, the mixed policy plans
    prefills into decode steps, and two replicas or TP 2 add a little."""
    return ((1.35 if d.router == "least_tokens" and d.replicas > 1 else 1.0) * (1.2 if d.policy == "mixed" else 1.0)
            * (1.1 if d.replicas > 1 else 1.0) * (1.05 if d.tp_size > 1 else 1.0))


def simulation_key(d: Deployment) -> Deployment:
    """Deployments with the same key are the same simulation, bit for bit: with one replica the
    router never chooses, so every router gives the row (tests/harness/test_plan_speed.py)."""
    return dataclasses.replace(d, router="") if d.replicas == 1 else d
