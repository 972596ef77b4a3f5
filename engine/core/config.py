"""Frozen configuration of the scheduler core. Hydra builds these at the entry point."""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("nano", "mixed")


@dataclass(frozen=True)
class SchedulerConfig:
    """Budgets and policy of the scheduler.

    policy: "nano" (a step is all prefill or all decode, prefill first) or "mixed"
    (vLLM V1: one token budget, running requests first, then new prefill chunks).
    max_num_seqs bounds the running set, not only one step's batch: a request that holds
    KV blocks but can never be scheduled would only waste cache.
    """

    policy: str = "nano"
    max_num_seqs: int = 512
    max_num_batched_tokens: int = 16384
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"SchedulerConfig.policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{name} must be a positive int, got {value!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "SchedulerConfig.max_num_batched_tokens must be >= max_num_seqs "
                f"({self.max_num_batched_tokens} < {self.max_num_seqs}): a full decode batch must fit the budget"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "SchedulerConfig.max_num_batched_tokens must be >= max_model_len when chunked prefill is off "
                f"({self.max_num_batched_tokens} < {self.max_model_len}): a long prompt could never be scheduled"
            )


@dataclass(frozen=True)
class CacheConfig:
    """KV-cache geometry. num_blocks None means "ask the backend" (engine: profiled; sim: planned)."""

    block_size: int = 256
    num_blocks: int | None = None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"CacheConfig.block_size must be a positive int, got {self.block_size!r}")
        if self.num_blocks is not None and (
            isinstance(self.num_blocks, bool) or not isinstance(self.num_blocks, int) or self.num_blocks < 1
        ):
            raise ValueError(f"CacheConfig.num_blocks must be a positive int or None, got {self.num_blocks!r}")
