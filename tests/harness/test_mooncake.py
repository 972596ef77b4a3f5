"""Mooncake traces: prompts from hash_ids (shared ids, shared tokens), writing workloads out as
Mooncake JSONL and reading them back, bad lines, and the prefix cache's hits on the real trace."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import build_run_config
from harness.run import run_once
from harness.workloads import (
    DEFAULT_TRACE_DIR,
    LengthConfig,
    SharedPrefixConfig,
    TraceError,
    WorkloadConfig,
    build_workload,
)
from harness.workloads.export import main as export_main
from harness.workloads.mooncake import BLOCK_TOKENS, block_seed, prompt_token_ids, write_mooncake
from tests.harness.conftest import compose_config

MOONCAKE = DEFAULT_TRACE_DIR / "mooncake_conversation_trace.jsonl"
needs_trace = pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/traces not beside the checkout")
B = BLOCK_TOKENS


def mooncake_cfg(path, **fields) -> WorkloadConfig:
    return WorkloadConfig(**{"name": None, "num_requests": None, "prompt_len": LengthConfig("trace"),
                             "output_len": LengthConfig("trace"), "arrival": "trace", "trace_path": str(path),
                             **fields})


def write_lines(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# Requests whose ids come from a few values, so that prefixes often agree, and whose lengths may
# end inside their last block or run past their ids (blocks of their own).
request = st.tuples(st.lists(st.integers(0, 3), max_size=5), st.integers(1, 6 * B))


@settings(max_examples=150, deadline=None)
@given(a=request, b=request, seed=st.integers(0, 2**32))
def test_prompts_share_k_blocks_iff_they_share_k_hash_ids(a, b, seed):
    (ids_a, len_a), (ids_b, len_b) = a, b
    flat = prompt_token_ids([ids_a, ids_b], np.array([len_a, len_b]), [0, 1],
                            block_seed(np.random.SeedSequence(seed)), bound=10000)
    tokens_a, tokens_b = flat[:len_a].tolist(), flat[len_a:].tolist()
    assert len(tokens_b) == len_b
    for k in range(1, min(len_a, len_b) // B + 1):
        same_ids = k <= min(len(ids_a), len(ids_b)) and ids_a[:k] == ids_b[:k]
        assert (tokens_a[: k * B] == tokens_b[: k * B]) == same_ids
    # a prompt ending inside a block it shares takes that block's leading tokens
    short, long_ = sorted([(len_a, ids_a, tokens_a), (len_b, ids_b, tokens_b)], key=lambda r: r[0])
    blocks = -(-short[0] // B)
    if blocks <= min(len(short[1]), len(long_[1])) and short[1][:blocks] == long_[1][:blocks]:
        assert long_[2][: short[0]] == short[2]


def test_a_block_is_the_same_whatever_its_position_in_the_list_of_prompts():
    seed = block_seed(np.random.SeedSequence(0))
    one = prompt_token_ids([[7, 8]], np.array([900]), [0], seed, 10000)
    many = prompt_token_ids([[1], [7, 8, 9], [2]], np.array([10, 1000, 5]), [0, 1, 2], seed, 10000)
    assert one.tolist() == many[10:910].tolist()
    other_seed = prompt_token_ids([[7, 8]], np.array([900]), [0], block_seed(np.random.SeedSequence(1)), 10000)
    assert one.tolist() != other_seed.tolist()


def test_reads_times_lengths_and_clips_keeping_the_leading_blocks(tmp_path):
    path = tmp_path / "t.jsonl"
    write_lines(path, [{"timestamp": 1000, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]},
                       {"timestamp": 1500, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 3]},
                       {"timestamp": 3000, "input_length": 600, "output_length": 30, "hash_ids": [4, 5]}])
    requests = build_workload(mooncake_cfg(path), 1 << 16).requests
    assert [r.arrival_time for r in requests] == [0.0, 0.5, 2.0]
    assert [r.num_prompt_tokens for r in requests] == [1500, 1100, 600]
    assert [r.sampling_params.max_tokens for r in requests] == [10, 20, 30]
    a, b, c = (r.token_ids for r in requests)
    assert a[: 2 * B] == b[: 2 * B] and a[2 * B] != b[2 * B] and a[0] != c[0]
    fast = build_workload(mooncake_cfg(path, rate_scale=2.0), 1 << 16).requests
    assert [r.arrival_time for r in fast] == [0.0, 0.25, 1.0]
    poisson = build_workload(mooncake_cfg(path, arrival="poisson", rate=5.0), 1 << 16).requests
    assert [r.token_ids for r in poisson] == [a, b, c]
    clipped = build_workload(mooncake_cfg(path), 700)
    assert clipped.num_prompts_clipped == 2
    assert [r.token_ids for r in clipped.requests] == [a[:690], b[:680], c]
    skipped = build_workload(mooncake_cfg(path, oversize="skip"), 700)
    assert [r.token_ids for r in skipped.requests] == [c] and skipped.num_skipped == 2


@needs_trace
def test_round_trip_keeps_lengths_times_and_sharing(tmp_path):
    cfg = mooncake_cfg(MOONCAKE.name, num_requests=300)
    first = build_workload(cfg, 1 << 20).requests
    written = write_mooncake(first, tmp_path / "again.jsonl")
    second = build_workload(mooncake_cfg(written), 1 << 20).requests
    assert [r.num_prompt_tokens for r in second] == [r.num_prompt_tokens for r in first]
    assert [r.sampling_params.max_tokens for r in second] == [r.sampling_params.max_tokens for r in first]
    assert [r.arrival_time for r in second] == [r.arrival_time for r in first]
    # the written ids are the file's renamed one for one
    original = [json.loads(line)["hash_ids"] for line in MOONCAKE.open().readlines()[:300]]
    renamed = [json.loads(line)["hash_ids"] for line in written.read_text().splitlines()]
    pairs = {(o, n) for old, new in zip(original, renamed, strict=True) for o, n in zip(old, new, strict=True)}
    assert [len(ids) for ids in renamed] == [len(ids) for ids in original]
    assert len({o for o, _ in pairs}) == len({n for _, n in pairs}) == len(pairs)
    # and writing what was read back gives the same file
    assert write_mooncake(second, tmp_path / "third.jsonl").read_text() == written.read_text()


def test_any_workload_written_out_shares_its_prefix_blocks(tmp_path):
    cfg = WorkloadConfig(num_requests=40, arrival="poisson", rate=7.0, prompt_len=LengthConfig("uniform", 1, 700),
                         shared_prefix=SharedPrefixConfig(num_groups=2, prefix_len=2 * B, fraction=0.5))
    requests = build_workload(cfg, 4096).requests
    path = write_mooncake(requests, tmp_path / "w.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    by_prefix: dict[tuple, set] = {}
    for r, record in zip(requests, records, strict=True):
        by_prefix.setdefault(tuple(r.token_ids[: 2 * B]), set()).add(tuple(record["hash_ids"][:2]))
    assert all(len(ids) == 1 for ids in by_prefix.values())  # equal prefixes, equal ids
    assert len({ids for group in by_prefix.values() for ids in group}) == len(by_prefix)  # and only they
    back = build_workload(mooncake_cfg(path), 4096).requests
    assert [r.arrival_time for r in back] == [round(r.arrival_time, 3) for r in requests]
    assert [r.num_prompt_tokens for r in back] == [r.num_prompt_tokens for r in requests]
    for x, y in [(0, 1), (2, 5), (3, 9)]:
        shared = records[x]["hash_ids"][:2] == records[y]["hash_ids"][:2]
        assert (back[x].token_ids[: 2 * B] == back[y].token_ids[: 2 * B]) == shared


@needs_trace
def test_export_command_writes_what_a_run_serves(tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    assert export_main([str(out), "workload=mooncake", "workload.num_requests=20"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 20 and all(r["input_length"] + r["output_length"] <= 4096 for r in records)
    assert export_main(["workload=mooncake"]) == 2 and "output file comes first" in capsys.readouterr().err
    assert export_main([str(tmp_path / "m.csv")]) == 2 and "must end in .jsonl" in capsys.readouterr().err



@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_export_help_prints_the_usage_and_exits_0(flag, capsys):
    assert export_main([flag]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: python -m harness.workloads.export OUT.jsonl [--block-tokens N]") and not err
    assert "workload=trace_azure_conv" in out  # the module's description and example follow


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}


@pytest.mark.parametrize("line, where", [
    ("{not json", r"line 2: not valid JSON"),
    ("[1, 2]", r"line 2: expected a JSON object, got list"),
    (json.dumps({**GOOD, "timestamp": -5}), r"line 2, field 'timestamp': must be a finite time >= 0 milliseconds"),
    (json.dumps({**GOOD, "input_length": 0}), r"line 2, field 'input_length': must be a whole number of tokens >= 1"),
    (json.dumps({**GOOD, "output_length": "7"}), r"line 2, field 'output_length': must be a whole number"),
    (json.dumps({**GOOD, "input_length": 2**63 - 1}), r"line 2, field 'input_length': must be a token count <= "),
    (json.dumps({**GOOD, "output_length": 1e300}), r"line 2, field 'output_length': must be a token count <= "),
    (json.dumps({**GOOD, "hash_ids": [0, 2**64]}), r"line 2, field 'hash_ids': must be a list of 64-bit integers"),
    (json.dumps({**GOOD, "hash_ids": 3}), r"line 2, field 'hash_ids': must be a list"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "input_length"}), r"line 2, field 'input_length': missing"),
])
def test_a_bad_line_is_one_error_naming_file_line_and_field(tmp_path, line, where):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(TraceError, match=re.escape(str(path)) + ", " + where) as error:
        build_workload(mooncake_cfg(path), 4096)
    assert "\n" not in str(error.value)


def test_empty_files_windows_and_shared_prefixes_are_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TraceError, match="the trace file is empty"):
        build_workload(mooncake_cfg(empty), 4096)
    one = tmp_path / "one.jsonl"
    write_lines(one, [GOOD])
    with pytest.raises(TraceError, match="start_row=3 but the trace has only 1 rows"):
        build_workload(mooncake_cfg(one, start_row=3), 4096)
    with pytest.raises(ValueError, match="workload.shared_prefix is not used with a Mooncake trace"):
        mooncake_cfg(one, shared_prefix=SharedPrefixConfig())


@needs_trace
@pytest.mark.parametrize("caching", [True, False])
def test_the_prefix_cache_hits_on_the_real_trace_only_when_on(caching):
    rc = build_run_config(compose_config(["workload=mooncake", "workload.num_requests=300",
                                          f"cache.enable_prefix_caching={str(caching).lower()}"]))
    summary = run_once(rc, progress=False).summary
    assert (summary["prefix_hit_rate"] > 0.1) if caching else (summary["prefix_hit_rate"] == 0.0)
