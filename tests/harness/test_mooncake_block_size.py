"""Mooncake traces hashed at another block size than Mooncake's 512 tokens (aiperf, guidellm and
Dynamo write 16, 64, 128): workload.hash_block_tokens says the size, requests sharing hash ids share
exactly the tokens those ids cover at that size, the prefix cache hits them at any cache block
size, and the export writes the chosen size and reads back as it was read."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.run import run_once
from harness.workloads import LengthConfig, WorkloadConfig, build_workload
from harness.workloads.export import main as export_main
from harness.workloads.mooncake import block_seed, prompt_token_ids, write_mooncake
from tests.harness.conftest import compose_config
from tests.harness.test_mooncake_hits import ideal_cached_tokens

SIZES = st.sampled_from([1, 3, 16, 64, 128, 512])


def mooncake_cfg(path, **fields) -> WorkloadConfig:
    return WorkloadConfig(**{"num_requests": None, "prompt_len": LengthConfig("trace"),
                             "output_len": LengthConfig("trace"), "arrival": "trace", "trace_path": str(path),
                             **fields})


def write_lines(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# a tree of hash ids: paths of up to 6 ids from a small alphabet, so that requests often share a
# leading run of ids and part ways below it; lengths end inside a block or run past the ids
@settings(max_examples=200, deadline=None)
@given(block=SIZES, data=st.data(), seed=st.integers(0, 2**32))
def test_tokens_agree_exactly_on_the_common_hash_id_prefix(block, data, seed):
    ids = st.lists(st.integers(0, 2), max_size=6)
    ids_a, ids_b = data.draw(ids), data.draw(ids)
    len_a, len_b = (data.draw(st.integers(1, 7 * block)) for _ in range(2))
    flat = prompt_token_ids([ids_a, ids_b], np.array([len_a, len_b]), [0, 1],
                            block_seed(np.random.SeedSequence(seed)), bound=1 << 30, block_tokens=block)
    a, b = flat[:len_a].tolist(), flat[len_a:].tolist()
    assert len(b) == len_b
    # the ids both prompts use (those within their blocks), and the tokens they cover in both
    used_a, used_b = ids_a[: -(-len_a // block)], ids_b[: -(-len_b // block)]
    shared = common_prefix(used_a, used_b)
    covered = min(shared * block, len_a, len_b)
    assert a[:covered] == b[:covered]
    # past the shared ids the tokens part at once (a 2^30-token alphabet: no chance agreement),
    # unless one prompt ended inside the shared blocks
    if covered < min(len_a, len_b):
        assert a[covered] != b[covered]


@settings(max_examples=12, deadline=None)
@given(block=st.sampled_from([8, 16, 64, 128]),
       requests=st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=4), st.integers(1, 600)),
                         min_size=2, max_size=5))
def test_the_prefix_cache_hits_the_shared_blocks_at_any_hash_block_size(trace_file, block, requests):
    path = trace_file
    write_lines(path, [{"timestamp": 60_000 * i, "input_length": length, "output_length": 2, "hash_ids": ids}
                       for i, (ids, length) in enumerate(requests)])
    rc = build_run_config(compose_config(["workload=mooncake", f"workload.trace_path={path}",
                                          f"workload.hash_block_tokens={block}", "scheduler.max_model_len=4096",
                                          "cache.block_size=16"]))
    result = run_once(rc, progress=False)
    served = build_workload(rc.workload, rc.scheduler.max_model_len, rc.model.vocab_size).requests
    prompts = [list(r.prompt_token_ids) for r in sorted(served, key=lambda r: r.arrival_time)]
    assert result.summary["cached_tokens"] == ideal_cached_tokens(prompts, 16)
    # and the shared tokens are those the hash ids promise at this block size
    for (ids_x, len_x), x in zip(requests, prompts, strict=True):
        for (ids_y, len_y), y in zip(requests, prompts, strict=True):
            shared = common_prefix(ids_x[: -(-len_x // block)], ids_y[: -(-len_y // block)])
            covered = min(shared * block, len_x, len_y)
            assert x[:covered] == y[:covered]


def test_a_trace_read_at_a_block_size_is_exported_at_it_and_reads_back_identically(tmp_path):
    records = [{"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [5, 6, 7]},
               {"timestamp": 250, "input_length": 33, "output_length": 4, "hash_ids": [5, 6, 9]},
               {"timestamp": 900, "input_length": 16, "output_length": 5, "hash_ids": [5]}]
    path = tmp_path / "aiperf.jsonl"
    write_lines(path, records)
    first = build_workload(mooncake_cfg(path, hash_block_tokens=16), 4096).requests
    assert first[0].token_ids[:32] == first[1].token_ids[:32] and first[0].token_ids[32] != first[1].token_ids[32]
    assert first[2].token_ids == first[0].token_ids[:16]
    out = tmp_path / "out.jsonl"
    assert export_main([str(out), "workload=mooncake", f"workload.trace_path={path}",
                        "workload.hash_block_tokens=16"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["hash_ids"] for r in written] == [[0, 1, 2], [0, 1, 3], [0]]  # the file's ids renamed
    assert [{k: r[k] for k in ("timestamp", "input_length", "output_length")} for r in written] == \
        [{k: r[k] for k in ("timestamp", "input_length", "output_length")} for r in records]
    second = build_workload(mooncake_cfg(out, hash_block_tokens=16), 4096).requests
    assert write_mooncake(second, tmp_path / "again.jsonl", 16).read_text() == out.read_text()


def test_the_export_writes_any_workload_at_the_block_size_asked(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    base = ["workload=poisson", "workload.num_requests=5", "workload.rate=2", "workload.seed=1"]
    assert export_main([str(out), "--block-tokens", "64", *base]) == 0
    lengths = [r.num_prompt_tokens for r in build_workload(compose_run_workload(base), 4096).requests]
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["hash_ids"]) for r in written] == [-(-n // 64) for n in lengths]
    assert export_main([str(out), "--block-tokens=0", *base]) == 2
    assert "--block-tokens must be an int >= 1" in capsys.readouterr().err


def compose_run_workload(overrides: list[str]) -> WorkloadConfig:
    return build_run_config(compose_config(overrides)).workload


@pytest.mark.parametrize("value", [0, -16, 1.5, True, "64"])
def test_a_bad_block_size_is_one_line_naming_the_field(tmp_path, value):
    with pytest.raises(ValueError, match=r"workload.hash_block_tokens must be an int >= 1"):
        mooncake_cfg(tmp_path / "t.jsonl", hash_block_tokens=value)


def test_a_block_size_on_a_workload_without_hash_ids_is_refused():
    with pytest.raises(ConfigError, match=r"workload.hash_block_tokens=64 is ignored by workload 'poisson'"):
        build_run_config(compose_config(["workload=poisson", "workload.hash_block_tokens=64"]))


def test_ids_past_a_prompts_blocks_are_logged_naming_the_setting(tmp_path, caplog):
    path = tmp_path / "t.jsonl"
    write_lines(path, [{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": list(range(38))}])
    with caplog.at_level(logging.WARNING):
        build_workload(mooncake_cfg(path), 4096)
    assert "1 prompts have more hash_ids than their 512-token blocks" in caplog.text
    assert "workload.hash_block_tokens=512" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build_workload(mooncake_cfg(path, hash_block_tokens=16), 4096)  # 38 ids of 16 tokens cover 600
    assert "hash_ids" not in caplog.text
