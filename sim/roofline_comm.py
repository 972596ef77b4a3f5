"""The roofline's tensor-parallel collectives (sim.roofline's "TP communication" phase).

Two all-reduces per layer plus one after the vocab-parallel embedding: a ring moves
2 * (tp - 1) / tp of the activation bytes over the interconnect plus a latency each; where
all_reduce takes the engine's one-shot launch for the step's size (engine.core.collectives), the
hardware's one-shot latency plus (tp - 1) x the bytes over its one-shot bandwidth. For the sampled
rows, one exchange of each rank's best tokens (a latency: a few bytes a row,
engine.sharded_sampling), or an all-gather of their logits (in the model's dtype) when a row
filters by top-k or top-p (engine.core.sampling_params.samples_by_shard).
"""

from __future__ import annotations

from engine.core.collectives import one_shot_max_tokens, priced_all_reduce
from engine.core.plan import StepPlan
from sim.specs import HardwareSpec, ModelSpec


def gathers_logits(plan: StepPlan) -> bool:
    """Whether tensor-parallel ranks gather the step's sampled rows' logits (a row filters by
    top-k or top-p) rather than exchange their best tokens: not samples_by_shard of the sampled
    rows, as a loop (it runs for every step of a TP > 1 replica)."""
    for entry in plan.scheduled:
        if entry.sample and entry.sampling_params.needs_whole_vocab:
            return True
    return False


class Collectives:
    """Seconds of one rank's collectives in a step; count is 0 at tp_size 1 (nothing to price)."""

    def __init__(self, model: ModelSpec, hw: HardwareSpec, tp: int, all_reduce: str) -> None:
        dt = model.dtype_bytes
        hidden = model.hidden_size
        link = hw.interconnect_bandwidth * hw.interconnect_efficiency
        self.count = 2 * model.num_layers + 1 if tp > 1 else 0  # all-reduces per step
        self._ring_s_per_token = 2.0 * (tp - 1) / tp * hidden * dt / link
        # the engine gathers each rank's logits in the weights' dtype and upcasts them after
        self._gather_s_per_row = (tp - 1) / tp * model.vocab_size * dt / link
        self._latency = hw.interconnect_latency_s
        self._one_shot_tokens, self._one_shot_latency, self._one_shot_s_per_token = 0, 0.0, 0.0
        if tp > 1 and all_reduce == "symmetric" and not hw.prices_one_shot:
            raise ValueError(f"hardware {hw.name} has no one_shot_latency_s / one_shot_bandwidth: "
                             "execution.all_reduce=symmetric cannot be priced on it")
        if priced_all_reduce(all_reduce, tp, hw.prices_one_shot) == "symmetric":
            latency, bandwidth = hw.one_shot_latency_s, hw.one_shot_bandwidth
            assert latency is not None and bandwidth is not None  # hw.prices_one_shot
            self._one_shot_tokens = one_shot_max_tokens(hidden, dt)
            self._one_shot_latency = latency
            self._one_shot_s_per_token = (tp - 1) * hidden * dt / bandwidth

    def all_reduces(self, num_tokens: int) -> float:
        """The step's all-reduces of [num_tokens, hidden] activations (one-shot or ring)."""
        if num_tokens <= self._one_shot_tokens:
            return self.count * (self._one_shot_latency + self._one_shot_s_per_token * num_tokens)
        return self.count * (self._latency + self._ring_s_per_token * num_tokens)

    def sampling(self, num_sampled: int, whole_vocab: bool) -> float:
        """The sampling exchange of a step with sampled rows: one latency, plus the logits'
        all-gather when whole_vocab (gathers_logits)."""
        return self._latency + (self._gather_s_per_row * num_sampled if whole_vocab else 0.0)
