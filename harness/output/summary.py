"""A run's summary row as typed values: what summarize() measured, who ran it, optional extras.

summary.csv is RunSummary.to_row() written as one row: the labels (identity, admission and fitting
counts) first, then the metrics, then any extras (a prediction interval's <metric>_lo/_hi columns).
A RunSummary is also a read-only mapping of those columns, so code that reads summary rows loaded
from CSV (dicts, pandas rows) reads a fresh one the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class FitCounts:
    """What fitting the workload to max_model_len cost (harness.workloads.Workload)."""

    num_clipped: int = 0
    num_prompts_clipped: int = 0
    num_outputs_clipped: int = 0
    prompt_tokens_clipped: int = 0
    output_tokens_clipped: int = 0
    num_skipped: int = 0


@dataclass(frozen=True)
class FleetLabels:
    """The shape of a fleet run: its router, replica count and tensor-parallel sizes."""

    router: str
    replicas: int
    tp_sizes: str  # each replica's TP size, space-separated
    gpus: int


@dataclass(frozen=True)
class RunLabels:
    """The columns a run puts before its metrics: what ran, on what, and what admission made of it."""

    backend: str
    model: str
    hardware: str
    workload: str
    policy: str
    num_submitted: int
    num_rejected: int
    fit: FitCounts
    wall_s: float  # seconds the run took on this machine (a timing of the tool, not a result)
    fleet: FleetLabels | None = None
    replica: int | None = None  # a fleet replica's own row

    def as_dict(self) -> dict[str, Any]:
        identity = {"backend": self.backend, "model": self.model, "hardware": self.hardware,
                    "workload": self.workload, "policy": self.policy}
        fit = dataclasses.asdict(self.fit)
        if self.fleet is None:
            return {**identity, "num_submitted": self.num_submitted, "num_rejected": self.num_rejected, **fit,
                    "wall_s": self.wall_s}
        # A fleet's rows carry the fleet's shape after the identity and their rejections last.
        replica = {} if self.replica is None else {"replica": self.replica}
        return {**identity, **dataclasses.asdict(self.fleet), "num_submitted": self.num_submitted, **fit,
                "wall_s": self.wall_s, **replica, "num_rejected": self.num_rejected}


@dataclass(frozen=True)
class RunSummary(Mapping[str, Any]):
    """One run's summary (harness.output.metrics.summarize); see the module docstring."""

    num_requests: int
    makespan_s: float
    input_tokens: int
    output_tokens: int
    input_tok_s: float
    output_tok_s: float
    total_tok_s: float
    request_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    e2e_mean_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    preemptions: int
    recomputed_tokens: int
    cached_tokens: int
    prefix_hit_rate: float
    num_blocks: int
    num_steps: int
    mean_batch_requests: float
    labels: RunLabels | None = None
    extras: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def metrics(self) -> dict[str, Any]:
        """The measured columns, in summary.csv's order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _NOT_METRICS}

    def to_row(self) -> dict[str, Any]:
        """summary.csv's row: labels, metrics, extras."""
        labels = self.labels.as_dict() if self.labels is not None else {}
        return {**labels, **self.metrics(), **self.extras}

    def with_extras(self, extras: Mapping[str, Any]) -> RunSummary:
        """This summary with more trailing columns (a prediction interval's bounds and settings)."""
        return dataclasses.replace(self, extras=MappingProxyType({**self.extras, **extras}))

    def bound(self, metric: str) -> tuple[float, float]:
        """(lo, hi) of metric's prediction interval; NaN where the run has none."""
        nan = float("nan")
        return self.extras.get(f"{metric}_lo", nan), self.extras.get(f"{metric}_hi", nan)

    # read-only mapping of the row's columns
    def __getitem__(self, column: str) -> Any:
        return self.to_row()[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_row())

    def __len__(self) -> int:
        return len(self.to_row())


_NOT_METRICS = frozenset({"labels", "extras"})
