"""The OpenAI request bodies the server accepts (pydantic), and the error body it answers with.

Unknown fields are refused (extra="forbid") rather than ignored as vLLM does, so a client that
asks for something the server would not do hears about it. Fields the OpenAI API has but this
server cannot honour (n > 1, logprobs, penalties) are refused by name unless they hold the value
that changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from engine.core.sampling_params import SamplingParams

_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Sampling(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1  # vLLM: -1 or 0 disable it
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    n: int = 1
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: Any = None
    return_token_ids: bool = False  # vLLM: the prompt's and the output's token ids in the response

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"only n=1 is supported (one choice per request), got {n}")
        return n

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, top_k: int) -> int:
        if top_k < -1:
            raise ValueError(f"must be -1 or 0 (disabled) or >= 1, got {top_k}")
        return top_k

    @field_validator("presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs")
    @classmethod
    def _unsupported(cls, value: Any, info: ValidationInfo) -> Any:
        """Only the value that changes nothing; logprobs: null or false (completions' 0 asks for
        the sampled token's log-probability, so 0 == False is not enough)."""
        if info.field_name == "logprobs":
            if value is not None and value is not False:
                raise ValueError("not supported by this server (only null or false)")
        elif value != _NEUTRAL[info.field_name]:
            raise ValueError(f"not supported by this server (only {_NEUTRAL[info.field_name]})")
        return value

    @model_validator(mode="after")
    def _min_tokens(self) -> _Sampling:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        return self

    @model_validator(mode="after")
    def _stream_options(self) -> _Sampling:
        # a whole answer has no last chunk to carry the usage: the options would be ignored
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is read only with stream=true")
        return self

    @property
    def stops(self) -> list[str]:
        """The stop strings; an empty one would match before the first token, so it stops nothing."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self, max_tokens: int | None, extra_stop_ids: tuple[int, ...]) -> SamplingParams:
        stop_ids = tuple(self.stop_token_ids or ())
        if not self.ignore_eos:
            stop_ids += tuple(t for t in extra_stop_ids if t not in stop_ids)
        return SamplingParams(temperature=self.temperature, top_k=self.top_k if self.top_k > 0 else -1,
                              top_p=self.top_p, max_tokens=max_tokens, ignore_eos=self.ignore_eos,
                              stop_token_ids=stop_ids, seed=self.seed, min_tokens=self.min_tokens)


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    echo: Literal[False] = False
    suffix: None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def output_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def error_body(message: str, status: int, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    """OpenAI's error shape, which its client raises as the status's APIStatusError."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
