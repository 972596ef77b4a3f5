"""Turn a WorkloadConfig into core Requests: lengths, arrivals, token ids, oversize handling.

NOTE on oversize requests (prompt + output > max_model_len): "clip" keeps the output length
(capped at max_model_len - 1, the one case where the output is cut) and truncates the prompt from
its end, so a shared system prompt survives; "skip" drops the request. Either way what was cut is
logged as a warning and reported in summary.csv (requests clipped; of them, prompts and outputs
cut and the tokens each lost; requests skipped): nothing is truncated silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core import Request
from harness.convert import ConfigError
from harness.workloads.config import WorkloadConfig
from harness.workloads.lengths import draw_arrivals, draw_lengths
from harness.workloads.mooncake import block_seed, prompt_token_ids, warn_uncovered
from harness.workloads.profile import expected_arrivals, profile_arrivals, profile_end
from harness.workloads.source import RequestSource, check_fits
from harness.workloads.trace import (
    ARRIVAL_COLUMN,
    HASH_COLUMN,
    OUTPUT_COLUMN,
    PROMPT_COLUMN,
    is_mooncake,
    read_trace,
    resolve_trace_path,
)

log = logging.getLogger(__name__)


@dataclass
class Workload:
    source: RequestSource  # the requests, made on demand (token ids drawn when a request is made)
    num_clipped: int = 0  # requests cut to fit max_model_len (prompt, output or both)
    num_prompts_clipped: int = 0  # of them, requests whose prompt was shortened
    num_outputs_clipped: int = 0  # of them, requests whose output was shortened
    prompt_tokens_clipped: int = 0  # prompt tokens cut, over all requests
    output_tokens_clipped: int = 0  # output tokens cut, over all requests
    num_skipped: int = 0  # requests dropped because they did not fit
    longest: int = 0  # the longest request before fitting (prompt + output tokens): the max_model_len fitting all

    @cached_property
    def requests(self) -> list[Request]:
        """Every request, in row order, all token ids in memory (stream() makes them one by one)."""
        return list(self.source.in_row_order())

    def __len__(self) -> int:
        return len(self.source)

    def stream(self, block_size: int | None = None, packed: bool = False) -> Iterator[Request]:
        """The requests in arrival order (ties in row order), each made when it is asked for: the
        same requests as `requests`, holding only those not yet served in memory. block_size: the
        block manager's; each request comes with its full prompt blocks' keys (RequestSource).
        packed: token ids as array("q"), not lists (RequestSource.in_arrival_order)."""
        return self.source.in_arrival_order(block_size, packed)

    def fit_counts(self) -> dict[str, int]:
        """What fitting max_model_len cost: the summary.csv columns."""
        return {"num_clipped": self.num_clipped, "num_prompts_clipped": self.num_prompts_clipped,
                "num_outputs_clipped": self.num_outputs_clipped, "prompt_tokens_clipped": self.prompt_tokens_clipped,
                "output_tokens_clipped": self.output_tokens_clipped, "num_skipped": self.num_skipped}


def build_workload(cfg: WorkloadConfig, max_model_len: int, vocab_size: int | None = None) -> Workload:
    """Deterministic requests for cfg: same seed (and config), same lengths, times and token ids."""
    len_seq, arrival_seq, token_seq, group_seq, seed_seq = np.random.SeedSequence(cfg.seed).spawn(5)
    trace = _load_trace(cfg)
    if trace is not None and cfg.trace_repeat and cfg.num_requests is not None:
        trace = _repeated(cfg, trace, cfg.num_requests)
    elif trace is not None and cfg.rate_profile is None and (cfg.num_requests or 0) > len(trace):
        log.warning("workload %s: workload.num_requests=%d but %s has %d rows from workload.start_row=%d; serving "
                    "those (workload.trace_repeat=true repeats them)", cfg.label, cfg.num_requests,
                    Path(str(cfg.trace_path)).name, len(trace), cfg.start_row)
    n = len(trace) if trace is not None else cfg.num_requests
    if cfg.rate_profile is not None:
        arrival = profiled_arrivals(cfg, np.random.default_rng(arrival_seq))
        n = len(arrival)
        check_fits(n)
        trace = _cycled(cfg, trace, n)
    else:
        check_fits(n)
        arrival = draw_arrivals(cfg, n, np.random.default_rng(arrival_seq), _column(trace, ARRIVAL_COLUMN))
    len_rng = np.random.default_rng(len_seq)
    prompt = draw_lengths(cfg.prompt_len, n, len_rng, _column(trace, PROMPT_COLUMN))
    output = _at_least_one_token(cfg, draw_lengths(cfg.output_len, n, len_rng, _column(trace, OUTPUT_COLUMN)))

    bound = min(cfg.max_token_id, vocab_size) if vocab_size else cfg.max_token_id
    group, prefixes = _shared_prefixes(cfg, n, np.random.default_rng(group_seq), bound)
    prefix_len = prefixes.shape[1]
    if cfg.shared_prefix is not None:
        prompt = prompt + prefix_len

    keep = np.ones(n, dtype=bool)
    longest = int((prompt + output).max()) if n else 0
    over = prompt + output > max_model_len
    num_over = int(over.sum())
    clipped = {}
    if num_over and cfg.oversize == "skip":
        keep &= ~over
        log.warning("workload %s: skipped %d of %d requests longer than max_model_len=%d",
                    cfg.label, num_over, n, max_model_len)
    elif num_over:
        prompt, output, clipped = _clip(cfg, prompt, output, over, max_model_len)
    own, drawer = _token_drawer(cfg, trace, keep, prompt, group, prefix_len, token_seq, bound)
    seeds = np.random.default_rng(seed_seq).integers(0, 2**62, size=n)
    # NOTE: ids come from one shared pool of Python ints so that millions of prompt tokens cost
    # a pointer each, not a fresh int object each; indexing the pool as a numpy object array maps
    # them all in one call (a Python-level lookup per token was a tenth of a plan evaluation).
    pool = np.array(list(range(bound)), dtype=object)
    source = RequestSource(
        arrival=arrival, prompt=prompt, output=output, group=group, own=own, seeds=seeds, keep=keep,
        prefixes=[pool[row].tolist() for row in prefixes], drawer=drawer, pool=pool,
        addressable=_hashed(trace),
        id_offset=cfg.start_row if trace is not None and cfg.rate_profile is None else 0,
        temperature=cfg.temperature, ignore_eos=cfg.ignore_eos)
    return Workload(source, num_skipped=num_over if cfg.oversize == "skip" else 0, longest=longest, **clipped)


def _at_least_one_token(cfg: WorkloadConfig, output: np.ndarray) -> np.ndarray:
    """A trace's outputs of 0 tokens (requests that ended at their prefill) served as 1, the token
    every request samples; logged, since the output is then longer than the file says."""
    zero = output == 0
    if not zero.any():
        return output
    log.warning("workload %s: %d requests have an output of 0 tokens in the trace; each is served with 1 "
                "(the token its prefill samples)", cfg.label, int(zero.sum()))
    return np.where(zero, 1, output)


def _shared_prefixes(cfg: WorkloadConfig, n: int, rng: np.random.Generator,
                     bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's shared-prefix group (-1: none) and the groups' prefix tokens [groups, prefix_len]."""
    sp = cfg.shared_prefix
    if sp is None:
        return np.full(n, -1, dtype=np.int64), np.zeros((0, 0), dtype=np.int64)
    prefixes = rng.integers(0, bound, size=(sp.num_groups, sp.prefix_len), dtype=np.int64)
    in_group = rng.random(n) < sp.fraction
    return np.where(in_group, rng.integers(0, sp.num_groups, size=n), -1), prefixes


def _hashed(trace: pd.DataFrame | None) -> bool:
    """Whether the prompts are a Mooncake trace's hash blocks: each row's ids a function of the row."""
    return trace is not None and HASH_COLUMN in trace


def _token_drawer(cfg: WorkloadConfig, trace, keep: np.ndarray, prompt: np.ndarray, group: np.ndarray,
                  prefix_len: int, token_seq: np.random.SeedSequence, bound: int
                  ) -> tuple[np.ndarray, Callable[[], Callable[[int, int], np.ndarray]]]:
    """Each request's own prompt tokens (those not from a shared group prefix), and a maker of the
    function that draws the own tokens of rows a..b."""
    if _hashed(trace):
        # A Mooncake trace: every prompt is its hash blocks' tokens (requests left out get none).
        own = np.where(keep, prompt, 0)
        hashes, key = trace[HASH_COLUMN].tolist(), block_seed(token_seq)
        warn_uncovered(hashes, own, trace[PROMPT_COLUMN].to_numpy(), cfg.hash_block_tokens)

        def drawer() -> Callable[[int, int], np.ndarray]:
            return lambda a, b: prompt_token_ids(hashes[a:b], own[a:b], range(a + cfg.start_row, b + cfg.start_row),
                                                 key, bound, cfg.hash_block_tokens)
    else:
        # Token ids: one generator for every request's own tokens (those not from a shared group
        # prefix), drawn in row order.
        own = np.where(group >= 0, np.maximum(prompt - prefix_len, 0), prompt)

        def drawer() -> Callable[[int, int], np.ndarray]:
            rng = np.random.default_rng(token_seq)
            return lambda a, b: rng.integers(0, bound, size=int(own[a:b].sum()), dtype=np.int64)
    return own, drawer


class _Drop(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextmanager
def fit_warnings_muted() -> Iterator[None]:
    """build_workload's clip and skip warnings are not logged within: for a caller that builds
    the same workload many times (one per deployment of a plan) and reports its fit once."""
    drop = _Drop()
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def _clip(cfg: WorkloadConfig, prompt: np.ndarray, output: np.ndarray, over: np.ndarray,
          max_model_len: int) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Fit the `over` rows into max_model_len: the output first capped at max_model_len - 1, then
    the prompt cut to what is left. Returns the new lengths and Workload's clip counts."""
    num_over = int(over.sum())
    if max_model_len < 2:
        raise ConfigError(f"scheduler.max_model_len={max_model_len} leaves no room for a prompt token and an "
                          f"output token: {num_over} requests cannot be clipped to fit (it must be >= 2)")
    new_output = np.where(over, np.minimum(output, max_model_len - 1), output)
    new_prompt = np.where(over, np.minimum(prompt, max_model_len - new_output), prompt)
    counts = {
        "num_clipped": num_over,
        "num_prompts_clipped": int((new_prompt < prompt).sum()),
        "num_outputs_clipped": int((new_output < output).sum()),
        "prompt_tokens_clipped": int((prompt - new_prompt).sum()),
        "output_tokens_clipped": int((output - new_output).sum()),
    }
    log.warning("workload %s: clipped %d of %d requests to fit max_model_len=%d: %d prompts lost %d tokens, "
                "%d outputs lost %d tokens", cfg.label, num_over, len(prompt), max_model_len,
                counts["num_prompts_clipped"], counts["prompt_tokens_clipped"],
                counts["num_outputs_clipped"], counts["output_tokens_clipped"])
    return new_prompt, new_output, counts


def profiled_arrivals(cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    """The arrivals of cfg.rate_profile; they replace workload.rate and num_requests (logged)."""
    assert cfg.rate_profile is not None
    end = profile_end(cfg.rate_profile, cfg.rate_period_s, cfg.duration_s)
    expected = expected_arrivals(cfg.rate_profile, cfg.rate_period_s, end)
    check_fits(int(expected), f"workload.rate_profile: about {expected:.3g} arrivals over {end:g} s")
    arrival = profile_arrivals(cfg.rate_profile, cfg.rate_period_s, end, cfg.arrival, cfg.cv, rng)
    if not len(arrival):
        raise ConfigError(f"workload.rate_profile gives no arrival over {end:g} s (seed {cfg.seed}): raise its rates "
                          "or workload.duration_s")
    replaced = [f"{k}={getattr(cfg, k)}" for k in ("rate", "num_requests") if getattr(cfg, k) is not None]
    log.info("workload %s: rate_profile gives %d arrivals over %.0f s%s", cfg.label, len(arrival), end,
             f" (in place of workload.{' and '.join(replaced)})" if replaced else "")
    return arrival


def _cycled(cfg: WorkloadConfig, trace: pd.DataFrame | None, n: int) -> pd.DataFrame | None:
    """The trace's rows for n profile arrivals: its first n, reused from the top when it has fewer."""
    if trace is None or len(trace) >= n:
        return None if trace is None else trace.iloc[:n].reset_index(drop=True)
    log.warning("workload %s: %d arrivals take lengths from a trace of %d rows, reused from its first row",
                cfg.label, n, len(trace))
    return trace.iloc[np.arange(n) % len(trace)].reset_index(drop=True)


def _repeated(cfg: WorkloadConfig, trace: pd.DataFrame, n: int) -> pd.DataFrame:
    """n rows: the trace's rows repeated from the top, each repeat's times shifted by the
    trace's span plus its mean gap (so repeats follow one another at the trace's rate); a trace
    whose times are all equal (one row, or a burst) repeats every second."""
    rows = len(trace)
    if rows >= n:
        return trace
    check_fits(n)
    copy = np.arange(n) // rows
    out = trace.iloc[np.arange(n) % rows].reset_index(drop=True)
    if ARRIVAL_COLUMN in trace:
        times = trace[ARRIVAL_COLUMN].to_numpy()
        span = float(times.max() - times.min())
        period = span + span / (rows - 1) if span > 0 else 1.0
        out[ARRIVAL_COLUMN] = out[ARRIVAL_COLUMN].to_numpy() + copy * period
    log.info("workload %s: %d requests from a trace of %d rows, repeated %d times (workload.trace_repeat)",
             cfg.label, n, rows, int(copy[-1]) + 1)
    return out


def _load_trace(cfg: WorkloadConfig) -> pd.DataFrame | None:
    if not cfg.uses_trace:
        return None
    columns = []
    if cfg.arrival == "trace":
        columns.append(ARRIVAL_COLUMN)
    if cfg.prompt_len.dist == "trace":
        columns.append(PROMPT_COLUMN)
    if cfg.output_len.dist == "trace":
        columns.append(OUTPUT_COLUMN)
    path = resolve_trace_path(cfg.trace_path, cfg.trace_dir)
    if cfg.prompt_len.dist == "trace" and is_mooncake(path):
        columns.append(HASH_COLUMN)  # the prompts' tokens follow the trace's blocks
    return read_trace(path, columns, cfg.start_row, None if cfg.rate_profile is not None else cfg.num_requests)


def _column(trace, name: str) -> np.ndarray | None:
    if trace is None or name not in trace:
        return None
    return trace[name].to_numpy()
