"""The seam between the scheduler core and a backend: plain data, no tensors.

A backend receives a StepPlan, computes (engine) or prices (simulator) it, and answers with a
StepResult. The shape follows vLLM V1: per request the number of tokens scheduled this step,
so a batch that mixes prefill chunks and decodes is expressible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.request import TokenIds
from engine.core.sampling_params import SamplingParams

# A sampling entry's token while it is still being sampled on the device: with overlapped steps
# (engine.core.async_scheduler) a decode entry of step N+1 carries it for the token step N
# samples, and the backend substitutes that token on the device. Token ids are never negative.
PLACEHOLDER = -1


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    num_blocks: int
    block_size: int


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    token_ids are the tokens whose KV is computed this step (positions
    num_computed_tokens .. num_computed_tokens + len(token_ids) - 1). block_table is the
    request's live table: read it during execute(), do not keep it.
    sample is False for a prefill chunk that does not reach the end of the known tokens:
    the backend may skip its logits and its token is ignored.
    prefix_key: the chained hash of the request's first full block of tokens (Request.block_hashes,
    hashed for the prefix cache), None where none is hashed (a prompt shorter than a block, prefix
    caching off): entries with equal keys start with the same tokens, whichever blocks hold them
    (two prompts prefilled in one step share no block). The simulator groups a mixture-of-experts
    step's sequences by it (sim.features.routing_sequences).
    """

    request_id: str
    token_ids: TokenIds
    num_computed_tokens: int
    block_table: list[int]
    sample: bool
    sampling_params: SamplingParams
    num_output_tokens: int  # tokens generated so far; with the seed, it keys seeded sampling
    is_decode: bool
    prefix_key: int | None = None

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens in KV after this step: what attention reads."""
        return self.num_computed_tokens + len(self.token_ids)


@dataclass(slots=True)
class StepStats:
    """What the step looked like when it was planned; one row of steps.csv.

    num_running and num_free_blocks are counted after planning; an AsyncScheduler has by then
    released the requests this step finishes by length, the plain Scheduler does so in update().
    repeated_kv_tokens: KV tokens the step's attention reads again, from blocks that another of
    its sequences reads too (engine.core.kv_reads); the distinct tokens it reads are its context
    tokens less these. decode_repeated_kv_tokens: the same among its decode entries alone.
    """

    step: int
    kind: str  # "prefill", "decode", "mixed" or "idle"
    num_requests: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_waiting: int
    num_running: int
    num_free_blocks: int
    num_preempted: int
    prefix_hit_tokens: int
    repeated_kv_tokens: int = 0
    decode_repeated_kv_tokens: int = 0


def step_kind(num_scheduled: int, prefill_tokens: int, decode_tokens: int) -> str:
    """StepStats.kind of a step of num_scheduled entries with these new tokens."""
    if not num_scheduled:
        return "idle"
    if not decode_tokens:
        return "prefill"
    return "decode" if not prefill_tokens else "mixed"


@dataclass(slots=True)
class StepPlan:
    scheduled: list[ScheduledRequest]
    stats: StepStats
    preempted_ids: list[str] = field(default_factory=list)
    # Requests that finished or were aborted since the previous plan: backends drop their state.
    released_ids: list[str] = field(default_factory=list)
    # False: run the step eagerly even where a captured CUDA graph would fit it (a profiler timing
    # eager steps sets it; the scheduler never does). Step features follow it, so the simulator too.
    use_cuda_graphs: bool = True

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_tokens(self) -> int:
        return self.stats.num_prefill_tokens + self.stats.num_decode_tokens


@dataclass(slots=True)
class StepResult:
    """token_ids is aligned with plan.scheduled; entries with sample=False are ignored.

    idle_s: set by executors that overlap steps (submit()): how long the device sat idle
    waiting for this step to be submitted, after the previous step ended. duration_s then runs
    from when the step could start to when it ended, so a run's sum(idle_s + duration_s) is its
    span on the device.
    """

    token_ids: list[int]
    duration_s: float
    idle_s: float | None = None
    # Overlapped steps on a wall clock: how long ago (when result() returned) the tokens became
    # ready on the host. The loop stamps them with that time, as a server streaming them from
    # another thread would, not with the later moment its single thread got round to reading them.
    ready_age_s: float = 0.0
