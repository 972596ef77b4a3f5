"""Workload settings that would be ignored are errors; clipping says exactly what it cut; the
generic trace workload replays a user's file and is named after it."""

from __future__ import annotations

import dataclasses
import logging
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.report import format_summary
from harness.study import run_study
from harness.workloads import LengthConfig, TraceError, WorkloadConfig, build_workload
from tests.harness.conftest import compose_config


@pytest.mark.parametrize("overrides, field, reader", [
    (["workload.trace_path=my.csv"], "workload.trace_path='my.csv'", "workload.arrival=trace"),
    (["workload.trace_dir=/tmp"], "workload.trace_dir='/tmp'", "workload.arrival=trace"),
    (["workload.start_row=5"], "workload.start_row=5", "workload.arrival=trace"),
    (["workload=poisson", "workload.rate_scale=2"], "workload.rate_scale=2.0", "workload.arrival=trace"),
    (["workload.rate=3"], "workload.rate=3.0", "workload.arrival=poisson or gamma"),
    (["workload=poisson", "workload.cv=3"], "workload.cv=3.0", "workload.arrival=gamma"),
    (["workload=sharegpt", "workload.rate_scale=2"], "workload.rate_scale=2.0", "workload.arrival=trace"),
    (["workload=mooncake", "workload.trace_repeat=true"], "workload.trace_repeat=True", "workload.num_requests=N"),
])
def test_a_setting_the_workload_would_ignore_is_a_one_line_error(overrides, field, reader):
    with pytest.raises(ConfigError) as error:
        build_run_config(compose_config(overrides))
    message = str(error.value)
    assert "\n" not in message and message.startswith(field) and reader in message
    assert "is ignored by workload" in message  # names the workload


def test_length_bounds_unread_by_the_dist_are_errors():
    with pytest.raises(ConfigError, match=r"workload\.prompt_len\.low=100, workload\.prompt_len\.high=1024: not used "
                                          r"by workload\.prompt_len\.dist=fixed"):
        build_run_config(compose_config(["workload.prompt_len.dist=fixed", "workload.prompt_len.value=64"]))
    rc = build_run_config(compose_config(["workload.prompt_len={dist: fixed, value: 64, low: null, high: null}"]))
    assert rc.workload.prompt_len == LengthConfig("fixed", value=64)


def test_the_settings_each_workload_ships_with_are_all_read():
    for name in ("bench", "poisson", "gamma", "shared_prefix", "sharegpt", "arxiv", "trace_azure_conv"):
        build_run_config(compose_config([f"workload={name}"]))  # raises if a shipped value were ignored


def _fixed(prompt: int, output: int, n: int = 1, **kw) -> WorkloadConfig:
    return WorkloadConfig(name="w", num_requests=n, prompt_len=LengthConfig("fixed", value=prompt),
                          output_len=LengthConfig("fixed", value=output), **kw)


def test_an_output_longer_than_max_model_len_is_reported_as_an_output_cut(caplog):
    # the case that was reported as "clipped the prompts": the output alone exceeds max_model_len
    with caplog.at_level(logging.WARNING):
        w = build_workload(_fixed(300, 5000, n=3), 4096)
    assert [len(r.prompt_token_ids) for r in w.requests] == [1] * 3
    assert [r.sampling_params.max_tokens for r in w.requests] == [4095] * 3
    assert (w.num_clipped, w.num_prompts_clipped, w.num_outputs_clipped) == (3, 3, 3)
    assert (w.prompt_tokens_clipped, w.output_tokens_clipped) == (3 * 299, 3 * 905)
    assert "3 prompts lost 897 tokens, 3 outputs lost 2715 tokens" in caplog.text


@settings(max_examples=60, deadline=None)
@given(prompt_low=st.integers(1, 3000), prompt_span=st.integers(0, 3000), output_low=st.integers(1, 3000),
       output_span=st.integers(0, 3000), max_model_len=st.integers(2, 5000))
def test_clip_counts_are_exactly_what_was_cut(prompt_low, prompt_span, output_low, output_span, max_model_len):
    cfg = WorkloadConfig(name="w", num_requests=40,
                         prompt_len=LengthConfig("uniform", prompt_low, prompt_low + prompt_span),
                         output_len=LengthConfig("uniform", output_low, output_low + output_span))
    wide = build_workload(cfg, 1 << 30).requests  # same seed, nothing clipped: the lengths asked for
    w = build_workload(cfg, max_model_len)
    asked_p = np.array([len(r.prompt_token_ids) for r in wide])
    asked_o = np.array([r.sampling_params.max_tokens for r in wide])
    got_p = np.array([len(r.prompt_token_ids) for r in w.requests])
    got_o = np.array([r.sampling_params.max_tokens for r in w.requests])
    assert (got_p >= 1).all() and (got_o >= 1).all() and (got_p + got_o <= max_model_len).all()
    assert w.num_clipped == int(((got_p < asked_p) | (got_o < asked_o)).sum())
    assert w.num_prompts_clipped == int((got_p < asked_p).sum())
    assert w.num_outputs_clipped == int((got_o < asked_o).sum())
    assert w.prompt_tokens_clipped == int((asked_p - got_p).sum())
    assert w.output_tokens_clipped == int((asked_o - got_o).sum())


def test_clip_counts_reach_summary_csv(tmp_path):
    table = run_study(compose_config(["workload.num_requests=20", "scheduler.max_model_len=600",
                                      "output.plots=false"]), tmp_path)
    row = table.iloc[0]
    assert row["num_clipped"] > 0 and row["num_prompts_clipped"] > 0 and row["prompt_tokens_clipped"] > 0
    assert row["num_outputs_clipped"] > 0 and row["output_tokens_clipped"] > 0  # outputs of up to 1024 > 599
    assert (f"{row['num_clipped']} clipped ({row['num_prompts_clipped']} prompts lost {row['prompt_tokens_clipped']} "
            f"tokens, {row['num_outputs_clipped']} outputs lost {row['output_tokens_clipped']} tokens)"
            in format_summary(row.to_dict()))


def _trace(tmp_path, text: str, name: str = "my_trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_generic_trace_replays_the_file_and_is_named_after_it(tmp_path):
    path = _trace(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens,other\n"
                            "10.5,12,3,x\n11.0,40,8,y\n13.25,7,1,z\n")
    cfg = compose_config(["workload=trace", f"workload.trace_path={path}", "output.plots=false"])
    rc = build_run_config(cfg)
    requests = build_workload(rc.workload, 4096).requests
    assert [r.arrival_time for r in requests] == [0.0, 0.5, 2.75]
    assert [len(r.prompt_token_ids) for r in requests] == [12, 40, 7]
    assert [r.sampling_params.max_tokens for r in requests] == [3, 8, 1]
    table = run_study(cfg, tmp_path / "run")
    assert table.iloc[0]["workload"] == "my_trace"
    named = build_run_config(compose_config(["workload=trace", f"workload.trace_path={path}", "workload.name=mine"]))
    assert named.workload.label == "mine"


def test_shipped_trace_workloads_are_named_after_their_file():
    rc = build_run_config(compose_config(["workload=trace_azure_conv", "workload.trace_path=other_trace.csv"]))
    assert rc.workload.label == "other_trace"
    assert build_run_config(compose_config(["workload=sharegpt"])).workload.label == "sharegpt_8k"


def test_generic_trace_needs_a_path():
    with pytest.raises(ConfigError, match=r"^workload\.trace_path: Missing mandatory value"):
        build_run_config(compose_config(["workload=trace"]))


def test_generic_trace_missing_column_names_file_line_and_column(tmp_path):
    path = _trace(tmp_path, "arrived_at,num_prefill_tokens\n0,5\n")
    rc = build_run_config(compose_config(["workload=trace", f"workload.trace_path={path}"]))
    with pytest.raises(TraceError, match=rf"{path}, line 1 \(header\): missing column 'num_decode_tokens'"):
        build_workload(rc.workload, 4096)
    bad = _trace(tmp_path, "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,2\n1,abc,2\n", "bad.csv")
    rc = build_run_config(compose_config(["workload=trace", f"workload.trace_path={bad}"]))
    with pytest.raises(TraceError, match=rf"{bad}, line 3, column 'num_prefill_tokens': expected a number"):
        build_workload(rc.workload, 4096)


def test_a_trace_without_arrival_times_is_told_the_lengths_only_recipe_which_works(tmp_path):
    path = _trace(tmp_path, "num_prefill_tokens,num_decode_tokens\n12,3\n40,8\n7,1\n", "lengths.csv")
    rc = build_run_config(compose_config(["workload=trace", f"workload.trace_path={path}"]))
    with pytest.raises(TraceError, match=r"missing column 'arrived_at'.*for a trace of lengths only, draw Poisson "
                                         r"arrival times: workload=trace_lengths workload.trace_path=FILE "
                                         r"workload.rate=REQ_PER_S$"):
        build_workload(rc.workload, 4096)
    with pytest.raises(ConfigError, match=r"^workload\.rate: Missing mandatory value"):
        build_run_config(compose_config(["workload=trace_lengths", f"workload.trace_path={path}"]))
    rc = build_run_config(compose_config(["workload=trace_lengths", f"workload.trace_path={path}", "workload.rate=2"]))
    assert rc.workload.label == "lengths" and rc.workload.num_requests is None  # every row
    requests = build_workload(rc.workload, 4096).requests
    assert [len(r.prompt_token_ids) for r in requests] == [12, 40, 7]
    assert [r.sampling_params.max_tokens for r in requests] == [3, 8, 1]
    times = [r.arrival_time for r in requests]
    assert times[0] == 0.0 and times == sorted(times) and len(set(times)) == 3  # drawn, not the trace's


@pytest.mark.parametrize("fields, setting", [
    ({"arrival": "trace", "rate_scale": 1e-310}, "workload.rate_scale=1e-310"),
    ({"arrival": "poisson", "rate": 1e-310}, "workload.rate=1e-310"),
])
def test_arrivals_at_infinity_are_refused_not_left_unserved(tmp_path, fields, setting):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,12,3\n2,7,1\n")
    cfg = WorkloadConfig(name=None, num_requests=None, prompt_len=LengthConfig("trace"),
                         output_len=LengthConfig("trace"), trace_path=str(path), **fields)
    with pytest.raises(ConfigError, match=rf"^{re.escape(setting)} puts 2 of 3 arrival times at infinity"):
        build_workload(cfg, 4096)


def test_label_without_name_or_trace_is_the_arrival_process():
    cfg = dataclasses.replace(_fixed(5, 5), name=None)
    assert cfg.label == "offline"
