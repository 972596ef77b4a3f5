"""When a request stops: the rule that update() applies to each token a step sampled.

Length first (max_tokens outputs), then the primary EOS token (unless ignore_eos) or one of the
request's stop tokens; vLLM's min_tokens holds EOS and stop tokens back until the request has
that many outputs. Both schedulers (engine.core.scheduler, engine.core.async_scheduler) ask it.
"""

from __future__ import annotations

from engine.core.request import FinishReason, Request


def stop_reason(request: Request, num_output_tokens: int, token: int, eos_token_id: int | None) -> FinishReason | None:
    """Why the request stops with token as its num_output_tokens-th output, None if it goes on."""
    params = request.sampling_params
    if num_output_tokens >= request.max_tokens:  # type: ignore[operator]  # Scheduler.add() resolved None
        return FinishReason.LENGTH
    if token == eos_token_id and not params.ignore_eos:
        reason = FinishReason.EOS
    elif token in params.stop_token_ids:
        reason = FinishReason.STOP
    else:
        return None
    return reason if num_output_tokens >= params.min_tokens else None
