"""A request's life in the scheduler: WAITING -> RUNNING -> FINISHED (with a reason).

Preemption sends a RUNNING request back to WAITING with its KV dropped; it keeps its tokens
(prompt and output so far) and recomputes them when admitted again.
"""

from __future__ import annotations

import enum
from array import array
from typing import TypeAlias

from engine.core.sampling_params import SamplingParams

# A request's token ids: a list, or an array("q") (the simulator's requests: no int object per
# token, engine.core.block_manager hashes its bytes); never both in one block manager (the
# prefix cache compares stored blocks with a request's ids).
TokenIds: TypeAlias = "list[int] | array[int]"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    LENGTH = "length"  # max_tokens or max_model_len reached
    EOS = "eos"
    STOP = "stop"  # one of stop_token_ids
    ABORTED = "aborted"


class Request:
    __slots__ = (
        "request_id", "token_ids", "num_prompt_tokens", "sampling_params", "max_tokens",
        "status", "finish_reason", "num_computed_tokens", "block_table", "block_hashes",
        "num_registered_blocks", "num_cached_tokens", "num_preemptions", "num_recomputed_tokens",
        "max_computed_tokens", "arrival_time", "first_scheduled_time", "first_token_time",
        "finish_time", "num_pending_tokens", "prefix_key",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: TokenIds,
        sampling_params: SamplingParams,
        arrival_time: float = 0.0,
    ) -> None:
        self.request_id = request_id
        # prompt, then output (an array("q") stays one, copied)
        self.token_ids: TokenIds = array("q", prompt_token_ids) if type(prompt_token_ids) is array \
            else list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.sampling_params = sampling_params
        self.max_tokens = sampling_params.max_tokens  # the scheduler resolves None at admission
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.num_computed_tokens = 0  # tokens whose KV is in the cache (or in a planned step)
        # Trailing entries of token_ids that are placeholders for tokens a planned step will sample.
        self.num_pending_tokens = 0
        self.block_table: list[int] = []
        # Chained hash of each full block of token_ids; a function of the tokens alone, so it
        # survives preemption and is computed once per block.
        self.block_hashes: list[int] = []
        self.num_registered_blocks = 0  # leading blocks already offered to the prefix cache
        # the hash of the prompt's first full block, set at admission (BlockManager.prefix_key):
        # ScheduledRequest.prefix_key; None while unset or where the prompt fills no block
        self.prefix_key: int | None = None
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache, over all admissions
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.max_computed_tokens = 0  # high-water mark: computing below it again is recompute
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> TokenIds:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> TokenIds:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
