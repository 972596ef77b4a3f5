"""Per-request sampling parameters, validated at construction."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How tokens are drawn for one request.

    temperature == 0 means greedy. top_k == -1 and top_p == 1.0 disable those filters.
    max_tokens None means "until max_model_len"; seed None means "the engine's own stream".
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    max_tokens: int | None = 64
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()  # a list or None (vLLM's default) is taken too
    seed: int | None = None
    # EOS and stop tokens do not end the request before this many outputs (vLLM's min_tokens; the
    # sampler does not mask them, so such a token can appear in the output)
    min_tokens: int = 0

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, (int, float))
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 means greedy), got {self.temperature}")
        _check_number("top_k", self.top_k, (int,))
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError(f"SamplingParams.top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        _check_number("top_p", self.top_p, (int, float))
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None:
            _check_number("max_tokens", self.max_tokens, (int,))
            if self.max_tokens < 1:
                raise ValueError(f"SamplingParams.max_tokens must be >= 1 or None, got {self.max_tokens}")
        _check_number("min_tokens", self.min_tokens, (int,))
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise ValueError(f"SamplingParams.min_tokens must be in [0, max_tokens={self.max_tokens}], "
                             f"got {self.min_tokens}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"SamplingParams.ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        stop = _token_tuple(self.stop_token_ids)
        for token in stop:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"SamplingParams.stop_token_ids must hold non-negative ints, got {token!r}")
        object.__setattr__(self, "stop_token_ids", stop)
        if self.seed is not None:
            _check_number("seed", self.seed, (int,))
            if not 0 <= self.seed < 2**63:
                raise ValueError(f"SamplingParams.seed must be in [0, 2**63), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_whole_vocab(self) -> bool:
        """Top-k or top-p on a sampled row: its cutoff is a function of every vocabulary entry, so
        tensor-parallel ranks cannot draw it from their own slices (engine.sharded_sampling)."""
        return not self.greedy and (self.top_k != -1 or self.top_p < 1.0)


def samples_by_shard(params: Iterable[SamplingParams]) -> bool:
    """Whether tensor-parallel ranks draw these rows' tokens from their slices of the vocabulary
    and exchange a few bytes a row, rather than gathering the rows' logits (the engine's rule,
    and what the simulator prices)."""
    return not any(p.needs_whole_vocab for p in params)


def _token_tuple(value: object) -> tuple[object, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"SamplingParams.stop_token_ids must be a list of token ids, got {type(value).__name__}")
    return tuple(value)


def _check_number(field: str, value: object, types: tuple[type, ...]) -> None:
    # bool is an int subclass; True as a temperature is almost certainly a bug in the caller.
    if isinstance(value, bool) or not isinstance(value, types):
        allowed = " or ".join(t.__name__ for t in types)
        raise TypeError(f"SamplingParams.{field} must be {allowed}, got {type(value).__name__}")
