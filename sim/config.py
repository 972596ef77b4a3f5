"""SimConfig: how the simulator prices steps and sizes the KV cache. Hydra builds it at the entry point."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.graph_sizes import prefill_graph_sizes
from sim.features import GraphSizes, cuda_graph_batch_sizes

COST_MODELS = ("roofline", "profiled")


@dataclass(frozen=True)
class SimConfig:
    """cost_model: "roofline" (from shapes and peaks) or "profiled" (fitted to profile_path, a
    step-timing CSV written by the engine's profiler or coefficients saved by ProfiledCostModel).
    vocab_size None: the model's. enforce_eager / max_cuda_graph_batch_size / prefill_graph_tokens
    mirror the engine's settings so the profiled model knows which steps replay a CUDA graph.
    async_scheduling mirrors the engine's (on by default on CUDA): the loop plans step N+1 while
    step N runs, so a request that arrives during step N is admitted one step later than with
    steps run one at a time, and a request that stops on EOS computes one discarded token.
    """

    cost_model: str = "roofline"
    profile_path: str | None = None
    tp_size: int = 1
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: int | None = None
    seed: int = 0
    vocab_size: int | None = None
    eos_token_id: int | None = None
    enforce_eager: bool = False
    max_cuda_graph_batch_size: int = 512
    prefill_graph_tokens: int = 4096
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        if self.cost_model not in COST_MODELS:
            raise ValueError(f"SimConfig.cost_model must be one of {COST_MODELS}, got {self.cost_model!r}")
        if self.cost_model == "profiled" and not self.profile_path:
            raise ValueError("SimConfig.profile_path must name a step-timing CSV when cost_model='profiled'")
        for name, low in (("tp_size", 1), ("seed", 0), ("max_cuda_graph_batch_size", 0), ("prefill_graph_tokens", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"SimConfig.{name} must be an int >= {low}, got {value!r}")
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
            raise ValueError(f"SimConfig.gpu_memory_utilization must be in (0, 1], got {util!r}")
        for name, low in (("activation_reserve_bytes", 0), ("vocab_size", 2), ("eos_token_id", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"SimConfig.{name} must be None or an int >= {low}, got {value!r}")
        for name in ("enforce_eager", "async_scheduling"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"SimConfig.{name} must be a bool, got {type(getattr(self, name)).__name__}")

    def graph_batch_sizes(self, max_num_seqs: int) -> tuple[int, ...]:
        """The decode batch sizes the simulated engine replays as CUDA graphs (none when eager): it
        captures up to max_cuda_graph_batch_size, but never beyond the scheduler's max_num_seqs."""
        if self.enforce_eager:
            return ()
        return cuda_graph_batch_sizes(min(self.max_cuda_graph_batch_size, max_num_seqs))

    def graph_sizes(self, max_num_seqs: int, max_num_batched_tokens: int) -> GraphSizes:
        """Every step shape the simulated engine replays as a CUDA graph: the decode batch sizes
        above and the prefill token counts up to prefill_graph_tokens (capped by the budget)."""
        if self.enforce_eager:
            return GraphSizes()
        prefill = prefill_graph_sizes(min(self.prefill_graph_tokens, max_num_batched_tokens))
        return GraphSizes(self.graph_batch_sizes(max_num_seqs), prefill)
