"""Trace files as they come from their publishers, not as this project writes them: Mooncake JSONL
variants (a byte-order mark, no hash_ids, 64-bit ids of either sign, ids beyond the prompt,
outputs of 0 tokens, a missing timestamp) and Azure's raw LLM inference CSVs (TIMESTAMP,
ContextTokens, GeneratedTokens)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.workloads import LengthConfig, TraceError, WorkloadConfig, build_workload
from harness.workloads.mooncake import BLOCK_TOKENS as B
from harness.workloads.trace import resolve_trace_path

RECORDS = [{"timestamp": 5000, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]},
           {"timestamp": 5000, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 3]},
           {"timestamp": 7000, "input_length": 600, "output_length": 30, "hash_ids": [4, 5]}]


def trace_cfg(path, **fields) -> WorkloadConfig:
    return WorkloadConfig(**{"name": None, "num_requests": None, "prompt_len": LengthConfig("trace"),
                             "output_len": LengthConfig("trace"), "arrival": "trace", "trace_path": str(path),
                             **fields})


def write(path, records, encoding="utf-8"):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding=encoding)
    return path


def served(path, **fields):
    return build_workload(trace_cfg(path, **fields), 1 << 16).requests


def test_a_byte_order_mark_is_read_past(tmp_path):
    plain = served(write(tmp_path / "a.jsonl", RECORDS))
    marked = served(write(tmp_path / "b.jsonl", RECORDS, encoding="utf-8-sig"))
    assert [r.token_ids for r in marked] == [r.token_ids for r in plain]


def test_rows_without_hash_ids_share_no_blocks_and_are_counted(tmp_path, caplog):
    records = [{k: v for k, v in r.items() if k != "hash_ids"} for r in RECORDS]
    with caplog.at_level(logging.WARNING):
        requests = served(write(tmp_path / "t.jsonl", records))
    assert "3 rows have no hash_ids" in caplog.text
    assert [r.num_prompt_tokens for r in requests] == [1500, 1100, 600]
    a, b, _ = (r.token_ids for r in requests)
    assert a[:B] != b[:B]


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.integers(-(2**63), 2**64 - 1), min_size=1, max_size=3, unique=True))
def test_any_64_bit_ids_are_names_equal_ids_equal_blocks(tmp_path_factory, ids):
    path = tmp_path_factory.mktemp("ids") / "t.jsonl"
    write(path, [{"timestamp": 0, "input_length": len(ids) * B, "output_length": 1, "hash_ids": ids},
                 {"timestamp": 1, "input_length": B, "output_length": 1, "hash_ids": ids[:1]},
                 {"timestamp": 2, "input_length": B, "output_length": 1, "hash_ids": [ids[-1]]}])
    first, second, third = (r.token_ids for r in served(path))
    assert first[:B] == second
    assert (first[-B:] == third) and ((first[:B] == third) == (len(ids) == 1))


def test_ids_out_of_64_bits_are_refused(tmp_path):
    path = write(tmp_path / "t.jsonl", [{**RECORDS[0], "hash_ids": [2**64]}])
    with pytest.raises(TraceError, match=r"line 1, field 'hash_ids': must be a list of 64-bit integers"):
        served(path)


def test_ids_beyond_the_prompt_are_counted(tmp_path, caplog):
    path = write(tmp_path / "t.jsonl", [{**r, "hash_ids": r["hash_ids"] + [90, 91]} for r in RECORDS])
    with caplog.at_level(logging.WARNING):
        longer = served(path)
    assert "3 prompts have more hash_ids than their 512-token blocks" in caplog.text
    assert [r.token_ids for r in longer] == [r.token_ids for r in served(write(tmp_path / "u.jsonl", RECORDS))]


def test_outputs_of_zero_tokens_are_served_as_one_and_counted(tmp_path, caplog):
    path = write(tmp_path / "t.jsonl", [RECORDS[0], {**RECORDS[1], "output_length": 0}, RECORDS[2]])
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,12,0\n2,7,0\n")
    with caplog.at_level(logging.WARNING):
        assert [r.sampling_params.max_tokens for r in served(path)] == [10, 1, 30]
        assert [r.sampling_params.max_tokens for r in served(csv)] == [5, 1, 1]
    assert "1 requests have an output of 0 tokens" in caplog.text
    assert "2 requests have an output of 0 tokens" in caplog.text
    with pytest.raises(TraceError, match="line 3, column 'num_prefill_tokens': must be a token count >= 1"):
        csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,0,3\n")
        served(csv)


def test_a_missing_timestamp_says_how_to_draw_arrivals(tmp_path):
    path = write(tmp_path / "t.jsonl", [{k: v for k, v in r.items() if k != "timestamp"} for r in RECORDS])
    with pytest.raises(TraceError, match=r"field 'timestamp': missing.*workload.arrival=poisson workload.rate="):
        served(path)
    assert len(served(path, arrival="poisson", rate=2.0)) == 3


def test_crlf_blank_lines_and_no_final_newline_read_as_the_plain_file(tmp_path):
    plain = served(write(tmp_path / "a.jsonl", RECORDS))
    odd = tmp_path / "b.jsonl"
    lines = [json.dumps(r) for r in RECORDS]
    odd.write_bytes(("\r\n".join(lines[:2]) + "\r\n\r\n  \r\n" + lines[2]).encode())
    assert [(r.arrival_time, r.token_ids) for r in served(odd)] == [(r.arrival_time, r.token_ids) for r in plain]


def test_a_directory_is_named_as_one_unless_the_trace_folder_has_the_file(tmp_path, monkeypatch):
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(TraceError, match="is a directory, not a trace file"):
        resolve_trace_path(str(tmp_path / "d.jsonl"))
    folder = tmp_path / "traces"
    folder.mkdir()
    write(folder / "d.jsonl", RECORDS)
    monkeypatch.chdir(tmp_path)  # d.jsonl in the cwd is the directory; the trace folder's is the file
    assert resolve_trace_path("d.jsonl", str(folder)) == (folder / "d.jsonl").resolve()


AZURE_RAW = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
             "2023-11-16 18:15:46.6805900,4808,10\n"
             "2023-11-16 18:15:50.1805900,3180,8\n"
             "2023-11-16 18:15:47.6805900,110,27\n")


def test_the_raw_azure_form_is_read_as_seconds_from_the_first_request(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_code.csv"
    path.write_text(AZURE_RAW)
    requests = served(path)
    assert [r.arrival_time for r in requests] == pytest.approx([0.0, 3.5, 1.0])
    assert [r.num_prompt_tokens for r in requests] == [4808, 3180, 110]
    assert [r.sampling_params.max_tokens for r in requests] == [10, 8, 27]
    # the 2024 traces' times carry a UTC offset; lengths-only use reads the token columns alone
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,100,3\n"
                    "2024-05-10 00:00:02.509930+00:00,50,4\n")
    assert [r.arrival_time for r in served(path)] == pytest.approx([0.0, 2.5])
    poisson = served(path, arrival="poisson", rate=1.0)
    assert [r.num_prompt_tokens for r in poisson] == [100, 50]


def test_a_bad_azure_time_names_its_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZURE_RAW + "yesterday,5,5\n")
    with pytest.raises(TraceError, match=r"line 5, column 'TIMESTAMP': expected a date and time .*, got 'yesterday'"):
        served(path)


def test_a_csv_of_neither_form_names_both(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("when,prompt,output\n1,2,3\n")
    with pytest.raises(TraceError, match=r"missing column 'arrived_at' \(or a raw trace's: 'TIMESTAMP'\)"):
        served(path)


def test_arrivals_keep_their_rows_whatever_the_order_of_times(tmp_path):
    rng = np.random.default_rng(0)
    times = rng.choice([0, 250.5, 1000, 1000, 9000], size=12)
    records = [{"timestamp": float(t) + 3e6, "input_length": int(i) + 1, "output_length": 1, "hash_ids": []}
               for i, t in enumerate(times)]
    requests = served(write(tmp_path / "t.jsonl", records))
    assert [r.arrival_time for r in requests] == pytest.approx(list((times - times.min()) / 1000))
    assert [r.num_prompt_tokens for r in requests] == list(range(1, 13))


@settings(max_examples=40, deadline=None)
@given(times=st.lists(st.sampled_from([0.0, 0.5, 3.0, 3.0, 7.25]), min_size=1, max_size=5),
       n=st.integers(1, 17))
def test_each_repeat_of_a_trace_starts_after_the_one_before_ends(tmp_path_factory, times, n):
    path = tmp_path_factory.mktemp("repeat") / "t.jsonl"
    write(path, [{"timestamp": t * 1000, "input_length": 3, "output_length": 1} for t in times])
    arrivals = [r.arrival_time for r in served(path, num_requests=n, trace_repeat=True)]
    rows = len(times)
    repeats = [arrivals[i:i + rows] for i in range(0, n, rows)]
    assert all(min(later) > max(earlier) for earlier, later in zip(repeats, repeats[1:]))


def test_asking_for_more_requests_than_the_trace_has_says_so(tmp_path, caplog):
    path = write(tmp_path / "t.jsonl", RECORDS)
    with caplog.at_level(logging.WARNING):
        assert len(served(path, num_requests=50, start_row=1)) == 2
    assert "workload.num_requests=50 but t.jsonl has 2 rows from workload.start_row=1" in caplog.text
    assert "workload.trace_repeat=true" in caplog.text


def test_json_lines_under_another_suffix_are_told_to_be_named_jsonl(tmp_path):
    path = write(tmp_path / "conversation_trace.json", RECORDS)
    with pytest.raises(TraceError, match=r"conversation_trace.json: holds JSON lines.*name it \.jsonl") as error:
        served(path)
    assert "\n" not in str(error.value)


def test_exporting_onto_a_directory_or_an_unwritable_place_is_one_line(tmp_path, capsys):
    from harness.workloads.export import main as export_main

    (tmp_path / "d.jsonl").mkdir()
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "d.jsonl", tmp_path / "file" / "under.jsonl"):
        assert export_main([str(out), "workload=poisson", "workload.num_requests=3"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot write {out}") and err.count("\n") == 1


def test_bytes_that_are_not_utf8_in_an_unread_field_are_read_past(tmp_path):
    line = json.dumps({**RECORDS[0], "note": "NOTE"}).encode().replace(b"NOTE", b"caf\xe9")
    (tmp_path / "t.jsonl").write_bytes(line + b"\n")
    assert served(tmp_path / "t.jsonl")[0].num_prompt_tokens == 1500
    (tmp_path / "t.csv").write_bytes(b"arrived_at,num_prefill_tokens,num_decode_tokens,note\n0,5,2,caf\xe9\n")
    assert served(tmp_path / "t.csv")[0].num_prompt_tokens == 5


def test_gzipped_traces_read_as_the_plain_ones(tmp_path):
    import gzip

    plain = served(write(tmp_path / "a.jsonl", RECORDS))
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress((tmp_path / "a.jsonl").read_bytes()))
    assert [r.token_ids for r in served(tmp_path / "a.jsonl.gz")] == [r.token_ids for r in plain]
    assert (trace_cfg(tmp_path / "a.jsonl.gz").label, trace_cfg(tmp_path / "b.csv.gz").label) == ("a", "b")
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(AZURE_RAW.encode()))
    assert [r.num_prompt_tokens for r in served(tmp_path / "b.csv.gz")] == [4808, 3180, 110]


@pytest.mark.parametrize("name, data, message", [
    ("z.jsonl", None, r"z.jsonl, line 1: not valid JSON"),  # gzip bytes under a plain name
    ("r.csv", bytes(range(256)) * 8, r"r.csv"),
    ("bad.jsonl.gz", b"not gzip at all", r"bad.jsonl.gz: cannot read"),
])
def test_unreadable_bytes_are_one_line(tmp_path, name, data, message):
    import gzip

    (tmp_path / name).write_bytes(gzip.compress(json.dumps(RECORDS[0]).encode()) if data is None else data)
    with pytest.raises(TraceError, match=message) as error:
        served(tmp_path / name)
    assert "\n" not in str(error.value)


record = st.fixed_dictionaries({
    "timestamp": st.one_of(st.integers(0, 10**7), st.floats(0, 1e7, allow_nan=False)),
    "input_length": st.integers(1, 3 * B), "output_length": st.integers(0, 50),
    "hash_ids": st.lists(st.integers(-5, 5), max_size=4)})
layout = st.fixed_dictionaries({"newline": st.sampled_from(["\n", "\r\n"]), "bom": st.booleans(),
                                 "blank": st.lists(st.sampled_from(["", "  ", "\t"]), max_size=2),
                                 "final_newline": st.booleans(), "extra": st.booleans(), "reverse_keys": st.booleans()})


@settings(max_examples=40, deadline=None)
@given(records=st.lists(record, min_size=1, max_size=5), how=layout)
def test_a_trace_reads_the_same_whatever_its_layout(tmp_path_factory, records, how):
    folder = tmp_path_factory.mktemp("layout")
    plain = served(write(folder / "plain.jsonl", records))
    lines = []
    for i, r in enumerate(records):
        fields = {**r, "session_id": f"s{i}", "extra": [1, {"x": None}]} if how["extra"] else dict(r)
        lines.append(json.dumps(dict(reversed(list(fields.items()))) if how["reverse_keys"] else fields))
        lines += how["blank"]
    text = how["newline"].join(lines) + (how["newline"] if how["final_newline"] else "")
    (folder / "odd.jsonl").write_bytes((b"\xef\xbb\xbf" if how["bom"] else b"") + text.encode())
    odd = served(folder / "odd.jsonl")
    assert [(r.arrival_time, r.token_ids, r.sampling_params.max_tokens) for r in odd] == \
        [(r.arrival_time, r.token_ids, r.sampling_params.max_tokens) for r in plain]
    assert [r.sampling_params.max_tokens for r in plain] == [max(r["output_length"], 1) for r in records]


@settings(max_examples=40, deadline=None)
@given(blanks=st.lists(st.sampled_from(["", "  ", "\t", "\r"]), min_size=4, max_size=4), bad=st.integers(0, 2))
def test_a_csv_error_names_the_line_holding_the_cell_past_blank_lines(tmp_path_factory, blanks, bad):
    rows = ["0,10,5", "1,12,3", "2,7,1"]
    rows[bad] = f"{bad},x,1"
    lines = ["arrived_at,num_prefill_tokens,num_decode_tokens"]
    for blank, row in zip(blanks, rows + [""]):
        lines += [blank, row]
    path = tmp_path_factory.mktemp("blank") / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf", line {lines.index(rows[bad]) + 1}, column 'num_prefill_tokens'"):
        served(path)


@pytest.mark.parametrize("name", ["t.jsonl", "t.csv"])
def test_a_utf16_file_is_named_as_one(tmp_path, name):
    path = tmp_path / name
    path.write_text(json.dumps(RECORDS[0]) if name.endswith(".jsonl") else "arrived_at,num_prefill_tokens\n",
                    encoding="utf-16")
    with pytest.raises(TraceError, match="UTF-16 text .*: save it as UTF-8"):
        served(path)


def test_burstgpt_columns_and_numeric_timestamps_are_read(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n7.5,GPT-4,1087,0,1087,API log\n")
    requests = served(path)
    assert [r.arrival_time for r in requests] == [0.0, 2.5]
    assert [(r.num_prompt_tokens, r.sampling_params.max_tokens) for r in requests] == [(472, 18), (1087, 1)]
