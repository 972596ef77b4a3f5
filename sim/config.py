"""SimConfig: how the simulator prices steps and sizes the KV cache. Hydra builds it at the entry point."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.config import ExecutionConfig

COST_MODELS = ("roofline", "profiled")


@dataclass(frozen=True)
class SimConfig:
    """cost_model: "roofline" (from shapes and peaks) or "profiled" (fitted to profile_path, a
    step-timing CSV written by the engine's profiler or coefficients saved by ProfiledCostModel).
    vocab_size None: the model's.
    execution: the settings the engine would run with (graphs, overlap, TP size, seed, memory);
    the simulator prices the steps the engine would run under them. With overlapped steps the
    loop plans step N+1 while step N runs, so a request that arrives during step N is admitted
    one step later than with steps run one at a time, and a request that stops on EOS computes
    one discarded token.
    """

    cost_model: str = "roofline"
    profile_path: str | None = None
    activation_reserve_bytes: int | None = None
    vocab_size: int | None = None
    eos_token_id: int | None = None
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)

    def __post_init__(self) -> None:
        if self.cost_model not in COST_MODELS:
            raise ValueError(f"SimConfig.cost_model must be one of {COST_MODELS}, got {self.cost_model!r}")
        if self.cost_model == "profiled" and not self.profile_path:
            raise ValueError("SimConfig.profile_path must name a step-timing CSV when cost_model='profiled'")
        for name, low in (("activation_reserve_bytes", 0), ("vocab_size", 2), ("eos_token_id", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"SimConfig.{name} must be None or an int >= {low}, got {value!r}")
        if not isinstance(self.execution, ExecutionConfig):
            raise TypeError(f"SimConfig.execution must be an ExecutionConfig, got {type(self.execution).__name__}")
