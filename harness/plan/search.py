"""Deployment search: the cheapest fleet (hardware, TP size, scheduler knobs, policy, router,
replicas) whose P90 TTFT and TPOT meet the SLO on the workload, by simulation.

For each configuration (everything but the replica count) the fewest replicas is searched for:
1, 2, 4, ... until one meets the SLO (early stop), then bisection between the last failing and the
first passing count. NOTE: this assumes latency does not worsen with more replicas, which holds
for the routers here up to simulation noise.

Dominance rule: a deployment is only evaluated when it costs less than the cheapest deployment
known to meet the SLO; a configuration whose single replica already costs that much is skipped,
and a search stops growing at the most replicas still cheaper than it. Configurations are searched
in rounds (each active one proposes its next replica count), so every round is one call of
evaluate_all(), the single place where deployments are evaluated: a parallel map can be passed in
there (default: serial). Deployments that are the same simulation (simulation_key: one replica,
any router) are simulated once; their rows are identical but for eval_s (0 for the copies).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import product
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig
from tqdm import tqdm

from engine.core.routers import RouterConfig
from harness.config import OutputConfig, RunConfig, build_run_config, on_hardware
from harness.convert import ConfigError
from harness.fleet.config import FleetConfig, build_fleet, with_tp_size
from harness.fleet.run import run_fleet_once
from harness.output.metrics import SUMMARY_STEP_COLUMNS
from harness.parallel import parallel_map
from harness.plan.config import PlanConfig, SLOConfig, build_plan, load_catalogue
from harness.plan.placement import placements, with_expert_parallel
from harness.plan.report import DEPLOYMENT_COLUMNS, fit_note, nearest_lines, plan_summary
from harness.plan.row import Deployment, PlanMeasures, PlanRow
from harness.run import cyclic_gc_paused
from harness.workloads import build_workload, fit_warnings_muted
from harness.workloads.prepared import Drawn, PreparedWorkload

log = logging.getLogger(__name__)

PLATEAU = 0.8  # growth stops once doubling the replicas improves the SLO ratio by less than 20%


@dataclass(frozen=True)
class PlanBase:
    """What every evaluation shares (picklable, for a parallel map)."""

    rc: RunConfig
    catalogue: dict
    slo: SLOConfig
    router: RouterConfig  # prefix_affinity's parameters; the name comes from the deployment

    def cost_per_hour(self, d: Deployment) -> float:
        return self.catalogue[d.hardware].price_per_gpu_hour * d.tp_size * d.replicas

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


class ReplicaSearch:
    """The fewest replicas of one configuration meeting the SLO: grow 1, 2, 4, ... then bisect.

    NOTE: growth also stops when doubling the replicas left the SLO ratio (the worse of P90 TTFT
    and TPOT over its target) above PLATEAU times its last value: the fleet no longer queues, and
    an idle replica's latency is a floor that no replica count lowers.
    """

    def __init__(self, config: Deployment, max_replicas: int) -> None:
        self.config = config
        self.max_replicas = max_replicas
        self.failing = 0  # most replicas known to fail
        self.passing: int | None = None  # fewest replicas known to pass
        self.done = False
        self.failing_ratio = math.inf  # slo_ratio at `failing` replicas

    def next_replicas(self, cap: int) -> int | None:
        """The next count to try, at most cap (dominance); None when the search is over."""
        if self.done:
            return None
        # never a count whose cost the known best already beats; a bisection midpoint past the cap
        # tries the cap instead, which may still pass and beat the best
        if self.passing is None:
            proposal = min(max(1, 2 * self.failing), self.max_replicas, cap)
        else:
            proposal = min((self.failing + self.passing) // 2, cap)
        if proposal <= self.failing or (self.passing is not None and proposal >= self.passing):
            self.done = True
            return None
        return proposal

    def record(self, replicas: int, row: PlanRow) -> None:
        if row.error:
            self.done = True  # more replicas of a configuration that cannot run do not help
        elif row.meets_slo:
            self.passing = replicas if self.passing is None else min(self.passing, replicas)
        elif replicas > self.failing:
            if self.passing is None and row.slo_ratio > PLATEAU * self.failing_ratio:
                self.done = True
            self.failing, self.failing_ratio = replicas, row.slo_ratio


def search(configs: Iterable[Deployment], base: PlanBase, max_replicas: int, batch_size: int = 1,
           progress: bool = False, mapper: Callable = map) -> pd.DataFrame:
    """Every evaluated deployment as a row (plan.csv). Each round takes the batch_size cheapest
    next deployments of the active searches (cheapest first, so a cheap fleet meeting the SLO prunes
    the dearer ones early); a single replica's result is shared by every router."""
    searches = [ReplicaSearch(c, max_replicas) for c in configs]
    rows: list[PlanRow] = []
    known: dict[Deployment, PlanRow] = {}  # rows by simulation_key: one simulation each
    best = math.inf
    with tqdm(desc="deployments evaluated", unit="dep", disable=not progress, leave=False) as bar:
        while True:
            proposals = []
            for s in searches:
                cap = max_replicas if math.isinf(best) else math.ceil(best / base.cost_per_hour(s.config)) - 1
                replicas = s.next_replicas(cap)
                if replicas is not None:
                    proposals.append((s, dataclasses.replace(s.config, replicas=replicas)))
            if not proposals:
                break
            proposals.sort(key=lambda p: base.cost_per_hour(p[1]))
            batch = proposals[:batch_size]  # the others propose again next round, against the new best
            todo = [d for _, d in batch if simulation_key(d) not in known]
            fresh = dict(zip(todo, evaluate_all(todo, base, mapper)))
            for s, deployment in batch:
                row = fresh.get(deployment) or dataclasses.replace(known[simulation_key(deployment)],
                                                                   deployment=deployment, eval_s=0.0)
                known.setdefault(simulation_key(deployment), row)
                s.record(deployment.replicas, row)
                rows.append(row)
                if row.meets_slo:
                    best = min(best, row.cost_per_hour)
            bar.update(len(todo))
    return pd.DataFrame([row.as_dict() for row in rows])


def configurations(plan: PlanConfig, rc: RunConfig) -> list[Deployment]:
    """The search space, each knob checked once (TP against the model, budgets against each other)."""
    for i, tp in enumerate(plan.tp_sizes):
        with_tp_size(rc, tp, f"plan.tp_sizes[{i}]")
    for seqs, tokens in product(plan.max_num_seqs, plan.max_num_batched_tokens):
        try:
            dataclasses.replace(rc.scheduler, max_num_seqs=seqs, max_num_batched_tokens=tokens)
        except ValueError as error:
            raise ConfigError(f"plan.max_num_seqs / plan.max_num_batched_tokens: {error}") from None
    return [Deployment(*values, expert_parallel=ep)
            for values in product(plan.hardware, plan.tp_sizes, plan.max_num_seqs, plan.max_num_batched_tokens,
                                  plan.policies, plan.routers)
            for ep in placements(plan, rc, values[1])]


def title_of(rc: RunConfig, label: str, slo: SLOConfig, over: str = "") -> str:
    return (f"{rc.model.name}, {label}{'; ' + over if over else ''}, "
            f"SLO P90 TTFT {slo.ttft_p90_s:g} s / TPOT {slo.tpot_p90_s:g} s")


def run_plan(cfg: DictConfig, output: OutputConfig, out_dir: Path) -> pd.DataFrame:
    """`python -m harness experiment=plan ...`: plan.csv, plan_summary.csv, plan.png, the cheapest
    deployment (or the nearest, and a ConfigError naming the SLO)."""
    from harness.plan.plots import plot_plan

    rc = build_run_config(cfg)
    if rc.backend != "sim":
        raise ConfigError(f"backend.name must be sim for the deployment search, got {rc.backend!r}")
    plan, slo = build_plan(cfg)
    _, router = build_fleet(cfg)
    base = PlanBase(rc, load_catalogue(plan.hardware), slo, router)
    configs = configurations(plan, rc)
    _log_profiles(base)
    label, max_model_len = rc.workload.label, rc.scheduler.max_model_len
    # Built once up front: a bad trace fails here once, and the fit is reported once for the plan.
    # NOTE: clipped requests are planned for, with a warning, not refused: a deployment's
    # max_model_len is often the limit it will serve, and a planner wants the answer with the caveat.
    with fit_warnings_muted():
        workload = build_workload(rc.workload, max_model_len)
    note = fit_note(workload, rc.workload, max_model_len)
    if note:
        log.warning(note)
    mapper = map if plan.parallel_backend == "serial" else partial(
        parallel_map, backend=plan.parallel_backend, address=plan.parallel_address,
        num_workers=plan.parallel_num_workers)
    table = search(configs, base, plan.max_replicas, plan.batch_size, output.progress, mapper) \
        if "aggregated" in plan.modes else pd.DataFrame()
    if "disaggregated" in plan.modes:
        from harness.plan.disagg import compare_modes

        table = compare_modes(table, plan, base, slo, title_of(rc, label, slo), out_dir, output.progress)
    table.to_csv(out_dir / "plan.csv", index=False)
    summary = plan_summary(table, slo, label, workload, max_model_len, rc.workload.oversize)
    if "disaggregated" in plan.modes:
        from harness.plan.disagg import mode_summary

        summary.update(mode_summary(table, plan.modes))
    pd.DataFrame([summary]).to_csv(out_dir / "plan_summary.csv", index=False)
    over = f"{workload.num_clipped or workload.num_skipped:,} requests over max_model_len" if note else ""
    title = title_of(rc, label, slo, over)
    plot_plan(table, slo, title, out_dir / "plan.png")
    print(f"{len(table)} deployments evaluated ({label}); outputs: {out_dir} (plan.csv, plan_summary.csv, plan.png)")
    if not summary["meets_slo"]:
        lines, error = nearest_lines(table, slo, plan.num_closest)
        print("\n".join(lines))
        raise ConfigError(error)
    _log_cheapest(summary)
    # the fit's warning came before the search's output: the answer says again that it is for the fitted requests
    print(f"cheapest deployment meeting the SLO{f' (with {over}: see the warning above)' if over else ''}:")
    shown = [c for c in (*DEPLOYMENT_COLUMNS, "expert_parallel") if c in summary]
    print(pd.DataFrame([summary])[shown].to_string(index=False))
    if "winner" in summary:
        for mode in plan.modes:
            print(f"cheapest {mode}: {summary[f'{mode}_deployment'] or 'none meets the SLO'}")
        print(f"winner: {summary['winner']}")
    return table


def _log_profiles(base: PlanBase) -> None:
    """Which fit prices each catalogue GPU, when the simulator is profiled (harness.config.on_hardware)."""
    if base.rc.sim is None or base.rc.sim.cost_model != "profiled":
        return
    for name, spec in base.catalogue.items():
        sim = on_hardware(base.rc, spec).sim
        carried = f", carried from {sim.profile_hardware.name}" if sim.profile_hardware is not None else ""
        log.info("plan: %s priced by the profile %s%s", name, sim.profile_path, carried)


def _log_cheapest(summary: dict) -> None:
    """The cheapest deployment in one log line; a disaggregated one (no single TP size) by its pools."""
    if summary.get("winner") == "disaggregated":
        log.info("cheapest deployment meeting the SLO: $%.2f/h: %s, max_num_seqs %d, max_num_batched_tokens %d",
                 summary["cost_per_hour"], summary["disaggregated_deployment"], summary["max_num_seqs"],
                 summary["max_num_batched_tokens"])
        return
    # tp_size is a float column once disaggregated rows (no single TP size: NaN) share the table
    log.info("cheapest deployment meeting the SLO: $%.2f/h: %d x %s (TP %d, %d GPUs), policy %s, router %s, "
             "max_num_seqs %d, max_num_batched_tokens %d: P90 TTFT %.3f s, P90 TPOT %.4f s",
             *(summary[c] for c in ("cost_per_hour", "replicas", "hardware", "tp_size", "gpus", "policy", "router",
                                    "max_num_seqs", "max_num_batched_tokens", "ttft_p90_s", "tpot_p90_s")))
