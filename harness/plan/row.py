"""A deployment the plan search evaluates, and its plan.csv row."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


def hourly_cost(*pools: tuple[float, int]) -> float:
    """Dollars an hour of pools of (price per GPU-hour, GPUs), to a millionth of a dollar: a price's
    binary fraction times a count (1.3 x 3 = 3.9000000000000004) would print, and tie, unevenly."""
    return round(sum(price * gpus for price, gpus in pools), 6)


@dataclass(frozen=True)
class Deployment:
    hardware: str  # a conf/hardware entry
    tp_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str
    router: str
    replicas: int = 1
    # mixture-of-experts models: whole experts per rank (execution.expert_parallel) or each expert
    # sliced over the ranks; None for a dense model, whose plan.csv has no such column
    expert_parallel: bool | None = None

    @property
    def gpus(self) -> int:
        return self.tp_size * self.replicas


@dataclass(frozen=True)
class PlanMeasures:
    """What the simulation of a deployment measured (plan.csv's metric columns)."""

    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    output_tok_s: float
    request_s: float
    num_rejected: int


MEASURE_COLUMNS = tuple(f.name for f in dataclasses.fields(PlanMeasures))


@dataclass(frozen=True)
class PlanRow(Mapping[str, Any]):
    """One evaluated deployment: plan.csv's row. measures is None where the deployment could not
    run (error says why); its metric columns are then NaN, so that a plan.csv where nothing ran
    still has them."""

    deployment: Deployment
    cost_per_hour: float
    slo_ratio: float  # the worse of P90 TTFT and TPOT over its SLO target; inf where it did not run
    meets_slo: bool
    error: str
    eval_s: float  # seconds the evaluation took on this machine (a timing of the tool, not a result)
    measures: PlanMeasures | None = None

    def as_dict(self) -> dict[str, Any]:
        """plan.csv's columns, in its order."""
        placement = dataclasses.asdict(self.deployment)
        if self.deployment.expert_parallel is None:
            del placement["expert_parallel"]
        head = {**placement, "gpus": self.deployment.gpus, "cost_per_hour": self.cost_per_hour}
        measures = dict.fromkeys(MEASURE_COLUMNS, math.nan) if self.measures is None \
            else dataclasses.asdict(self.measures)
        return {**head, **measures, "slo_ratio": self.slo_ratio, "meets_slo": self.meets_slo, "error": self.error,
                "eval_s": self.eval_s}

    def __getitem__(self, column: str) -> Any:
        return self.as_dict()[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())
