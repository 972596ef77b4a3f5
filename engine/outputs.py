"""What LLM.generate returns, and the throughput shown on its progress bar."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.plan import StepStats


@dataclass
class RequestOutput:
    """One prompt's result, in the order the prompts were given.

    token_ids are the generated tokens (an end-of-sequence or stop token that ended the request
    included, as Hugging Face's generate includes it); text is their decoding without special
    tokens. finish_reason is vLLM's: "length" (max_tokens or max_model_len reached), "stop" (an
    end-of-sequence or stop token) or "aborted"; stop_reason is the stop token that ended it, None
    for an end-of-sequence token or any other reason. A request that was rejected has error set
    (what was wrong with it), finish_reason None and no tokens.
    """

    request_id: str
    prompt: str | None  # the prompt string, None when token ids were given
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


class ThroughputMeter:
    """Prefill and decode tokens per second over a run, for the progress bar.

    A step's time counts toward prefill if it computed prompt tokens and toward decode if it
    decoded: a mixed step counts toward both, since its cost cannot be split between them.
    """

    def __init__(self) -> None:
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0

    def add(self, stats: StepStats, duration_s: float) -> None:
        if stats.num_prefill_tokens:
            self.prefill_tokens += stats.num_prefill_tokens
            self.prefill_s += duration_s
        if stats.num_decode_tokens:
            self.decode_tokens += stats.num_decode_tokens
            self.decode_s += duration_s

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def describe(self) -> str:
        return f"prefill {self.prefill_tokens_per_s:,.0f} tok/s, decode {self.decode_tokens_per_s:,.0f} tok/s"
