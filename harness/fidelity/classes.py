"""The held-out protocol's workload classes: traffic no calibration saw, each a change
of one RunConfig. Lengths are written in tokens for a GPU model and multiplied by length_scale
(a CPU run of the tiny model uses 1/16), so the classes keep their shape at any size.

- prefill_heavy: prompts of 2-8k tokens and few outputs, past the 4,096-token prefill graphs,
  with max_model_len 10,240 (above the default 4,096);
- decode_heavy: prompts of 0.5-1.5k, outputs of 1-2k tokens;
- conversation: the Azure conversation trace's own arrivals, rescaled to the rate; its own lengths
  at length_scale 1, else conversation-like uniform lengths scaled down;
- bursty: gamma arrivals with CV 4, the bench's lengths;
- shared_prefix: 8 system prompts of 1,024 tokens ahead of every request (prefix-cache hits);
- preempting_bench: the bench's lengths with the KV cache pinned to a pool the class's requests
  oversubscribe as nano-vllm's bench oversubscribes 400 blocks (preempting_pool_blocks), so it
  preempts at any num_requests; a fixed preempt_num_blocks overrides it;
- code_completion: long prompts (about 2,000 tokens, up to 7,400) and outputs of a few tokens with
  a long tail (most 5-50, up to 1,900), lognormal both (CodeCompletionShape), at the Azure
  conversation trace's real, bursty arrival times replayed at the rate; max_model_len 8,192.
Every class is built offline (the drain measures the engine's capacity); with_rate() then sets
its arrivals to a rate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from harness.config import RunConfig
from harness.workloads import LengthConfig, SharedPrefixConfig, WorkloadConfig, read_trace, resolve_trace_path

CLASSES = ("prefill_heavy", "decode_heavy", "conversation", "bursty", "shared_prefix", "preempting_bench",
           "code_completion")
LONG_MAX_MODEL_LEN = 10240  # prefill_heavy's, in GPU tokens: above 8k prompts plus their outputs
TRACE = "azure_conv_2023.csv"
BURSTY_CV = 4.0

# class -> (prompt low/high, output low/high) in GPU tokens, and the arrival process it runs at
_LENGTHS = {"prefill_heavy": (2048, 8192, 16, 48), "decode_heavy": (512, 1536, 1024, 2048),
            "conversation": (200, 2000, 20, 400), "bursty": (100, 1024, 100, 1024),
            "shared_prefix": (50, 500, 50, 300), "preempting_bench": (100, 1024, 100, 1024)}
_ARRIVAL = {"conversation": "trace", "bursty": "gamma", "code_completion": "trace"}
_SHARED_PREFIX_LEN = 1024
# nano-vllm's bench with a 400-block pool of 256-token blocks: 256 requests of ~1,124 tokens each
# (prompt and output uniform in 100-1,024) ask for 1,124 blocks, 2.8x the pool, and preempt
# (142 preemptions when an H100 engine serves it). A fixed pool stops preempting when fewer
# requests are served (80 requests ask for 351 of its 400 blocks), so the pool follows the demand.
PREEMPT_OVERSUBSCRIPTION = 2.8


@dataclass(frozen=True)
class CodeCompletionShape:
    """code_completion's lengths, in GPU tokens: lognormal prompts and outputs, each clipped to its
    range. The defaults give prompts of mean ~2,030 (median 1,700, P99 ~6,900) and outputs of median
    18 and mean ~30, 42% of them within 10-30 tokens, a tail past 300 (Azure's 2023 code-completion
    service: prompts of about 2,000 tokens up to 7,400, outputs mostly 10-30 up to 1,900)."""

    prompt_median: float = 1700.0
    prompt_sigma: float = 0.6
    prompt_low: int = 64
    prompt_high: int = 7400
    output_median: float = 18.0
    output_sigma: float = 1.0
    output_low: int = 2
    output_high: int = 1900
    max_model_len: int = 8192

    def lengths(self, scale: float) -> tuple[LengthConfig, LengthConfig]:
        """(prompt, output) at length_scale `scale`."""
        return (_lognormal(self.prompt_median, self.prompt_sigma, self.prompt_low, self.prompt_high, scale),
                _lognormal(self.output_median, self.output_sigma, self.output_low, self.output_high, scale))


CODE_COMPLETION = CodeCompletionShape()


def _scaled(tokens: int, scale: float) -> int:
    return max(1, int(round(tokens * scale)))


def _lognormal(median: float, sigma: float, low: int, high: int, scale: float) -> LengthConfig:
    lo, hi = _scaled(low, scale), _scaled(high, scale)
    return LengthConfig("lognormal", lo, hi, median=min(max(median * scale, lo), hi), sigma=sigma)


def max_model_len(base: int, scale: float) -> int:
    """The engine's max_model_len for the protocol: prefill_heavy's prompts must fit."""
    return max(base, _scaled(LONG_MAX_MODEL_LEN, scale))


def preempting_pool_blocks(num_requests: int, length_scale: float, block_size: int) -> int:
    """KV blocks that the preempting bench's requests oversubscribe PREEMPT_OVERSUBSCRIPTION times
    (their mean prompt plus output), but never fewer than its longest request needs alone."""
    p_lo, p_hi, o_lo, o_hi = (_scaled(t, length_scale) for t in _LENGTHS["preempting_bench"])
    demand = num_requests * ((p_lo + p_hi) / 2 + (o_lo + o_hi) / 2) / block_size
    longest = -(-(p_hi + o_hi) // block_size)
    return max(longest, int(np.ceil(demand / PREEMPT_OVERSUBSCRIPTION)))


def class_run_config(rc: RunConfig, name: str, num_requests: int, length_scale: float,
                     preempt_num_blocks: int | None = None,
                     code_completion: CodeCompletionShape = CODE_COMPLETION) -> RunConfig:
    """rc serving class `name` offline (arrivals are set later by with_rate). preempt_num_blocks:
    the preempting bench's pool; None sizes it to the class (preempting_pool_blocks)."""
    if name not in CLASSES:
        raise ValueError(f"fidelity.workloads: unknown class {name!r}; known: {CLASSES}")
    if name == "code_completion":
        return _code_completion(rc, num_requests, length_scale, code_completion)
    p_lo, p_hi, o_lo, o_hi = (_scaled(t, length_scale) for t in _LENGTHS[name])
    prompt, output = LengthConfig("uniform", p_lo, p_hi), LengthConfig("uniform", o_lo, o_hi)
    lengths_from_trace = name == "conversation" and length_scale == 1.0
    if lengths_from_trace:
        prompt, output = LengthConfig("trace"), LengthConfig("trace")
    workload = dataclasses.replace(
        rc.workload, name=name, num_requests=num_requests, prompt_len=prompt, output_len=output,
        arrival="offline", rate=None, cv=1.0, rate_scale=1.0, trace_path=TRACE if lengths_from_trace else None,
        shared_prefix=SharedPrefixConfig(8, _scaled(_SHARED_PREFIX_LEN, length_scale), 1.0)
        if name == "shared_prefix" else None)
    cache = rc.cache
    if name == "preempting_bench":
        if preempt_num_blocks is None:
            preempt_num_blocks = preempting_pool_blocks(num_requests, length_scale, cache.block_size)
        cache = dataclasses.replace(cache, num_blocks=preempt_num_blocks)
    return dataclasses.replace(rc, workload=workload, cache=cache)


def _code_completion(rc: RunConfig, num_requests: int, scale: float, shape: CodeCompletionShape) -> RunConfig:
    """The code_completion class offline; its scheduler admits up to the class's max_model_len (longer
    requests are clipped, as the workload reports), below the engine's own where that is larger."""
    prompt, output = shape.lengths(scale)
    workload = dataclasses.replace(
        rc.workload, name="code_completion", num_requests=num_requests, prompt_len=prompt, output_len=output,
        arrival="offline", rate=None, cv=1.0, rate_scale=1.0, trace_path=None, shared_prefix=None)
    limit = min(rc.scheduler.max_model_len, _scaled(shape.max_model_len, scale))
    scheduler = dataclasses.replace(rc.scheduler, max_model_len=limit)
    return dataclasses.replace(rc, workload=workload, scheduler=scheduler)


def with_rate(rc: RunConfig, name: str, rate: float) -> RunConfig:
    """The class's own arrival process at `rate` requests per second."""
    arrival = _ARRIVAL.get(name, "poisson")
    w = rc.workload
    if arrival == "trace":
        w = dataclasses.replace(w, arrival="trace", trace_path=TRACE)
        w = dataclasses.replace(w, rate_scale=rate / trace_rate(w))
    else:
        w = dataclasses.replace(w, arrival=arrival, rate=rate, cv=BURSTY_CV if arrival == "gamma" else 1.0)
    return dataclasses.replace(rc, workload=w)


def trace_rate(w: WorkloadConfig) -> float:
    """Requests per second of the trace rows the workload replays, at their own times."""
    path = resolve_trace_path(w.trace_path, w.trace_dir)
    times = read_trace(path, ["arrived_at"], w.start_row, w.num_requests)["arrived_at"].to_numpy(dtype=float)
    span = float(np.ptp(times)) if len(times) > 1 else 0.0
    if span <= 0:
        raise ValueError(f"{path}: rows {w.start_row}.. have no arrival span to take a rate from")
    return (len(times) - 1) / span
