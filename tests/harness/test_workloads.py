"""Workloads: the bench's shape, seeded determinism, arrival processes, traces, shared prefixes."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import pytest

from harness.workloads import (
    DEFAULT_TRACE_DIR,
    LengthConfig,
    SharedPrefixConfig,
    TraceError,
    WorkloadConfig,
    build_workload,
)

AZURE = DEFAULT_TRACE_DIR / "azure_conv_2023.csv"
needs_traces = pytest.mark.skipif(not AZURE.is_file(), reason="../shared/traces not beside the checkout")


def test_bench_matches_nano_vllm_bench():
    requests = build_workload(WorkloadConfig(), max_model_len=4096).requests
    assert len(requests) == 256
    prompts = np.array([r.num_prompt_tokens for r in requests])
    outputs = np.array([r.sampling_params.max_tokens for r in requests])
    assert prompts.min() >= 100 and prompts.max() <= 1024 and outputs.min() >= 100 and outputs.max() <= 1024
    assert len(set(prompts)) > 150  # really spread, not a constant
    assert all(0 <= t < 10000 for r in requests for t in r.token_ids)
    assert all(r.sampling_params.ignore_eos and r.sampling_params.temperature == 0.6 for r in requests)
    assert all(r.arrival_time == 0.0 for r in requests)


def test_uniform_bounds_are_inclusive():
    cfg = WorkloadConfig(num_requests=2000, prompt_len=LengthConfig("uniform", 1, 3),
                         output_len=LengthConfig("uniform", 5, 6))
    requests = build_workload(cfg, 4096).requests
    assert {r.num_prompt_tokens for r in requests} == {1, 2, 3}
    assert {r.sampling_params.max_tokens for r in requests} == {5, 6}


def test_lognormal_lengths_have_their_median_and_stay_in_bounds():
    cfg = WorkloadConfig(num_requests=4000, prompt_len=LengthConfig("lognormal", 64, 7400, median=1700, sigma=0.6),
                         output_len=LengthConfig("lognormal", 2, 1900, median=18, sigma=1.0))
    requests = build_workload(cfg, 16384).requests
    prompts = np.array([r.num_prompt_tokens for r in requests])
    outputs = np.array([r.sampling_params.max_tokens for r in requests])
    assert prompts.min() >= 64 and prompts.max() <= 7400 and outputs.min() >= 2 and outputs.max() <= 1900
    assert np.median(prompts) == pytest.approx(1700, rel=0.05) and np.median(outputs) == pytest.approx(18, rel=0.1)
    # exp(sigma^2 / 2) above the median on average, and a tail far past it
    assert prompts.mean() == pytest.approx(1700 * np.exp(0.18), rel=0.05)
    assert np.percentile(outputs, 99) > 8 * 18 and outputs.min() <= 3


@pytest.mark.parametrize("fields, where", [
    (dict(low=10, high=100, median=5, sigma=1.0), "median"),
    (dict(low=10, high=100, median=50, sigma=0.0), "sigma"),
    (dict(low=10, high=100, median=50), "sigma"),
    (dict(low=0, high=100, median=50, sigma=1.0), "lognormal"),
])
def test_lognormal_refuses_bad_settings_by_name(fields, where):
    with pytest.raises(ValueError, match=where):
        LengthConfig("lognormal", **fields).validate("workload.prompt_len")


def test_median_and_sigma_are_not_read_by_uniform_lengths():
    with pytest.raises(ValueError, match=r"workload\.prompt_len\.median=30"):
        LengthConfig("uniform", 1, 100, median=30).validate("workload.prompt_len")


def test_same_seed_same_requests_other_seed_other_ids():
    a = build_workload(WorkloadConfig(num_requests=20), 4096).requests
    b = build_workload(WorkloadConfig(num_requests=20), 4096).requests
    c = build_workload(WorkloadConfig(num_requests=20, seed=1), 4096).requests
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.sampling_params for r in a] == [r.sampling_params for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_arrival_process_does_not_change_lengths_or_ids():
    offline = build_workload(WorkloadConfig(num_requests=50), 4096).requests
    poisson = build_workload(WorkloadConfig(num_requests=50, arrival="poisson", rate=3.0), 4096).requests
    assert [r.token_ids for r in offline] == [r.token_ids for r in poisson]
    assert any(r.arrival_time > 0 for r in poisson)


def _gaps(cfg: WorkloadConfig) -> np.ndarray:
    times = np.array([r.arrival_time for r in build_workload(cfg, 4096).requests])
    assert times[0] == 0.0 and np.all(np.diff(times) >= 0)
    return np.diff(times)


def test_poisson_and_gamma_rates_and_burstiness():
    fixed = LengthConfig("fixed", value=4)
    poisson = _gaps(WorkloadConfig(num_requests=20000, prompt_len=fixed, output_len=fixed, arrival="poisson", rate=5.0))
    assert 1 / poisson.mean() == pytest.approx(5.0, rel=0.05)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)
    gamma = _gaps(WorkloadConfig(num_requests=20000, prompt_len=fixed, output_len=fixed, arrival="gamma",
                                 rate=5.0, cv=3.0))
    assert 1 / gamma.mean() == pytest.approx(5.0, rel=0.1)
    assert gamma.std() / gamma.mean() == pytest.approx(3.0, rel=0.1)


def test_token_ids_respect_a_small_vocabulary():
    requests = build_workload(WorkloadConfig(num_requests=10), 4096, vocab_size=512).requests
    assert max(t for r in requests for t in r.token_ids) < 512


def test_oversize_requests_are_clipped_or_skipped_and_counted():
    cfg = WorkloadConfig(num_requests=200, prompt_len=LengthConfig("uniform", 100, 1000),
                         output_len=LengthConfig("uniform", 100, 1000))
    lengths = [(r.num_prompt_tokens, r.sampling_params.max_tokens) for r in build_workload(cfg, 4096).requests]
    over = sum(p + o > 1200 for p, o in lengths)
    clipped = build_workload(cfg, 1200)
    assert clipped.num_clipped == over > 0 and clipped.num_skipped == 0 and len(clipped.requests) == 200
    assert all(r.num_prompt_tokens + r.sampling_params.max_tokens <= 1200 for r in clipped.requests)
    # clipping keeps the output length and truncates the prompt
    assert [r.sampling_params.max_tokens for r in clipped.requests] == [o for _, o in lengths]
    skipped = build_workload(dataclasses.replace(cfg, oversize="skip"), 1200)
    assert skipped.num_skipped == over and len(skipped.requests) == 200 - over


def test_shared_prefix_groups_share_their_first_tokens():
    cfg = WorkloadConfig(num_requests=200, prompt_len=LengthConfig("fixed", value=10),
                         output_len=LengthConfig("fixed", value=5),
                         shared_prefix=SharedPrefixConfig(num_groups=3, prefix_len=64, fraction=1.0))
    requests = build_workload(cfg, 4096).requests
    assert all(r.num_prompt_tokens == 74 for r in requests)
    assert len({tuple(r.token_ids[:64]) for r in requests}) == 3
    none = build_workload(dataclasses.replace(cfg, shared_prefix=SharedPrefixConfig(3, 64, 0.0)), 4096).requests
    assert len({tuple(r.token_ids[:64]) for r in none}) == 200
    half = build_workload(dataclasses.replace(cfg, shared_prefix=SharedPrefixConfig(3, 64, 0.5)), 4096).requests
    prefixes = pd.Series([tuple(r.token_ids[:64]) for r in half]).value_counts()
    assert 80 <= prefixes.iloc[:3].sum() <= 120 and (prefixes.iloc[3:] == 1).all()


@needs_traces
def test_azure_replay_keeps_rows_times_and_scales_rate():
    cfg = WorkloadConfig(name="az", num_requests=100, start_row=10, prompt_len=LengthConfig("trace"),
                         output_len=LengthConfig("trace"), arrival="trace", trace_path="azure_conv_2023.csv")
    rows = pd.read_csv(AZURE).iloc[10:110]
    requests = build_workload(cfg, 1 << 20).requests
    assert [r.request_id for r in requests] == [str(i) for i in range(10, 110)]
    assert [r.num_prompt_tokens for r in requests] == rows["num_prefill_tokens"].tolist()
    assert [r.sampling_params.max_tokens for r in requests] == rows["num_decode_tokens"].tolist()
    expected = (rows["arrived_at"] - rows["arrived_at"].min()).to_numpy()
    assert np.allclose([r.arrival_time for r in requests], expected)
    fast = build_workload(dataclasses.replace(cfg, rate_scale=4.0), 1 << 20).requests
    assert np.allclose([r.arrival_time for r in fast], expected / 4.0)


@needs_traces
def test_lengths_only_trace_with_poisson_arrivals():
    cfg = WorkloadConfig(name="sg", num_requests=50, prompt_len=LengthConfig("trace"),
                         output_len=LengthConfig("trace"), arrival="poisson", rate=2.0, trace_path="sharegpt_8k.csv")
    rows = pd.read_csv(DEFAULT_TRACE_DIR / "sharegpt_8k.csv").iloc[:50]
    requests = build_workload(cfg, 1 << 20).requests
    assert [r.num_prompt_tokens for r in requests] == rows["num_prefill_tokens"].tolist()
    assert requests[-1].arrival_time > 0


def _trace_cfg(path) -> WorkloadConfig:
    return WorkloadConfig(name="bad", num_requests=None, prompt_len=LengthConfig("trace"),
                          output_len=LengthConfig("trace"), arrival="trace", trace_path=str(path))


@pytest.mark.parametrize("body, where", [
    ("arrived_at,num_prefill_tokens\n0.0,10\n", r"line 1 \(header\): missing column 'num_decode_tokens'"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n1.0,-3,5\n",
     r"line 3, column 'num_prefill_tokens': must be a token count >= 1, got -3"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n1.0,10,5\n2.0,12,lots\n",
     r"line 4, column 'num_decode_tokens': expected a number, got 'lots'"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n,10,5\n",
     r"line 3, column 'arrived_at': expected a number, got an empty cell"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10.5,5\n",
     r"line 2, column 'num_prefill_tokens': must be a whole number"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n-1.0,10,5\n", r"line 2, column 'arrived_at'"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,1e300,5\n",
     r"line 2, column 'num_prefill_tokens': must be a token count <= 2147483647"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,9223372036854775807\n",
     r"line 2, column 'num_decode_tokens': must be a token count <= 2147483647"),
    ("Timestamp,Request tokens,Response tokens\n5,472,18\n,1087,3\n",  # BurstGPT: seconds
     r"line 3, column 'Timestamp': expected a number, got an empty cell"),
    ("Timestamp,Request tokens,Response tokens\n5,472,18\n7.5x,1087,3\n", r"line 3, column 'Timestamp': .* got '7.5x'"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens,num_prefill_tokens\n0.0,10,5,20\n",
     r"column 'num_prefill_tokens' appears more than once in the header"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,True\n1.0,10,False\n",
     r"line 2, column 'num_decode_tokens': expected a number, got True"),
    ("", r"the trace file is empty"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n", r"no request rows"),
])
def test_malformed_trace_names_file_row_and_column(tmp_path, body, where):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=re.escape(str(path)) + ".*" + where):
        build_workload(_trace_cfg(path), 4096)


def test_missing_trace_names_the_places_tried(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        build_workload(_trace_cfg("nowhere.csv"), 4096)


def test_workload_config_rejects_bad_values():
    with pytest.raises(ValueError, match="workload.rate"):
        WorkloadConfig(arrival="poisson", rate=None)
    with pytest.raises(ValueError, match="workload.trace_path"):
        WorkloadConfig(arrival="trace")
    with pytest.raises(ValueError, match="workload.num_requests"):
        WorkloadConfig(num_requests=None)
    with pytest.raises(ValueError, match="workload.shared_prefix.fraction"):
        WorkloadConfig(shared_prefix=SharedPrefixConfig(fraction=1.5))


def test_clipping_into_a_one_token_context_is_a_config_error():
    from harness.convert import ConfigError

    with pytest.raises(ConfigError, match="scheduler.max_model_len=1 leaves no room"):
        build_workload(WorkloadConfig(num_requests=3), max_model_len=1)
