"""Whether a request can ever be served by a scheduler: its prompt and max_tokens against
max_model_len and the whole KV cache (Scheduler.check_fits; the HTTP server asks it too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.core.block_manager import BlockManager
    from engine.core.config import SchedulerConfig
    from engine.core.request import Request


def fitted_max_tokens(request: Request, cfg: SchedulerConfig, block_manager: BlockManager) -> int:
    """The request's max_tokens (None resolved to what max_model_len leaves), or ValueError
    naming why it can never be served: an empty prompt, no room left within max_model_len, or
    more KV blocks than the whole cache has."""
    rid = request.request_id
    prompt_len = request.num_prompt_tokens
    if prompt_len == 0:
        raise ValueError(f"request {rid!r} has an empty prompt: at least one token is needed")
    if prompt_len >= cfg.max_model_len:
        raise ValueError(
            f"request {rid!r}: prompt of {prompt_len} tokens leaves no room to generate "
            f"within max_model_len={cfg.max_model_len}"
        )
    max_tokens = request.sampling_params.max_tokens
    if max_tokens is None:
        max_tokens = cfg.max_model_len - prompt_len
    elif prompt_len + max_tokens > cfg.max_model_len:
        raise ValueError(
            f"request {rid!r}: prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) "
            f"exceeds max_model_len={cfg.max_model_len}"
        )
    # The last sampled token is never written to the cache.
    blocks_needed = block_manager.blocks_for(prompt_len + max_tokens - 1)
    if blocks_needed > block_manager.num_blocks:
        raise ValueError(
            f"request {rid!r} needs {blocks_needed} KV blocks ({prompt_len} prompt + {max_tokens} "
            f"output tokens) but the whole cache has {block_manager.num_blocks}"
        )
    return max_tokens
