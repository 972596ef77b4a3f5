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
evaluate_all() (harness.plan.evaluate), the single place where deployments are evaluated. The
command (`experiment=plan`) is harness.plan.run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from itertools import product

import pandas as pd
from tqdm import tqdm

from harness.config import RunConfig
from harness.convert import ConfigError
from harness.fleet.config import with_tp_size
from harness.plan.config import PlanConfig
from harness.plan.evaluate import PlanBase, evaluate_all, simulation_key
from harness.plan.placement import placements
from harness.plan.row import Deployment, PlanRow

PLATEAU = 0.8  # growth stops once doubling the replicas improves the SLO ratio by less than 20%


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
