"""More than one HTTP process in front of one core process (serve.api_servers): the core process's
fan-in/fan-out channel, the shared metrics board, the queue's split, and servers of two and three
fronts driven over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import httpx
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from engine.core.request import FinishReason
from harness.serve.board import MetricsBoard
from harness.serve.build import front_share
from harness.serve.config import ServeConfig
from harness.serve.front import listening_socket
from harness.serve.metrics import ServerMetrics, row_width
from harness.serve.overhead import overhead_summary
from harness.serve.passes import CoreSnapshot
from harness.serve.stream_counter import count_streams
from harness.serve.wire import CoreChannel, FanChannel
from tests.harness.serve.conftest import SIM, start_server

MODEL = "qwen3-8b"


def _add(rid: str) -> tuple:
    return ("add", SimpleNamespace(request_id=rid), 0.0)


def _drain(channel: CoreChannel) -> list:
    out: list = []
    for _ in range(50):  # what was sent is in the socket already; a few polls read it all
        out += channel.poll()
    return out


def test_fan_channel_routes_each_request_to_the_front_that_sent_it():
    pairs = [socket.socketpair() for _ in range(3)]
    fan = FanChannel([core_end for _, core_end in pairs])
    fronts = [CoreChannel(front_end) for front_end, _ in pairs]
    fronts[0].send(_add("a"))
    fronts[2].send(_add("b"))
    fronts[1].send(("stop",))  # only front 0 stops the core
    assert sorted(m[1].request_id for m in fan.wait() + fan.poll()) == ["a", "b"]
    snap = (2, 0, 5)
    fan.send(("step", 1.5, [("a", [7], None, 0), ("b", [8], FinishReason.LENGTH, 3)], snap))
    assert _drain(fronts[0]) == [("step", 1.5, [("a", [7], None, 0)], snap)]
    assert _drain(fronts[1]) == [("snap", snap)]  # no request there: the gauges alone
    assert _drain(fronts[2]) == [("step", 1.5, [("b", [8], FinishReason.LENGTH, 3)], snap)]
    assert fan.owner == {"a": 0}  # b finished
    fan.send(("tokens", 2.0, [("a", [9], None, 0)]))
    assert _drain(fronts[0]) == [("tokens", 2.0, [("a", [9], None, 0)])] and _drain(fronts[1]) == []
    fan.send(("result", "tables"))
    fan.send(("ready", "info", 0.0))
    assert _drain(fronts[0]) == [("result", "tables"), ("ready", "info", 0.0)]
    assert _drain(fronts[1]) == _drain(fronts[2]) == [("ready", "info", 0.0)]
    # a front that goes away has its requests aborted; the others go on
    fronts[1].send(_add("c"))
    fronts[1].send(_add("d"))
    fronts[1].send(("abort", "d"))
    pairs[1][0].close()
    got = fan.poll()
    assert [m[0] for m in got] == ["add", "add", "abort", "abort"] and got[-1] == ("abort", "c")
    fan.send(("step", 3.0, [("a", [1], None, 0)], snap))  # nothing written to the closed front, no error
    assert not fan.closed
    assert _drain(fronts[0]) == [("step", 3.0, [("a", [1], None, 0)], snap)]
    pairs[0][0].close()
    fan.poll()
    assert fan.closed  # front 0 gone: the core stops


def test_the_board_sums_every_front_and_a_scrape_on_any_front_sees_it():
    board = MetricsBoard.create(2, row_width())
    other = MetricsBoard(os.dup(board.fd), 2, row_width())  # as the second process maps it
    cores = [SimpleNamespace(snapshot=CoreSnapshot(live=live), passing=False) for live in (1, 2)]
    fronts = [ServerMetrics(core, MODEL, b, front)  # type: ignore[arg-type]
              for front, (core, b) in enumerate(zip(cores, (board, other)))]
    fronts[0].tokens(5)
    fronts[0].ttft.observe(0.03)
    cores[1].passing = True  # a finish within a pass waits for the pass's end to be published
    fronts[1].finished(100, 40, 7, "length", 1.0)
    assert other.rows[1].sum() == 0
    cores[1].passing = False
    fronts[1].tokens(7)
    fronts[1].finished(0, 0, 0, "stop", 1.0)  # outside a pass: published at once (with the tokens)
    assert other.rows[1, 3] == 7  # generation_tokens
    for metrics in (fronts[0], fronts[1]):
        samples = [s for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples]
        values = {s.name: s.value for s in samples}
        assert values["vllm:generation_tokens_total"] == 12
        assert values["vllm:prefix_cache_hits_total"] == 40
        assert values["vllm:time_to_first_token_seconds_count"] == 1
        assert values["vllm:e2e_request_latency_seconds_count"] == 2
        assert sum(s.value for s in samples if s.name == "vllm:request_success_total") == 2  # length, stop
        assert values["harness:num_requests_live"] == 3
    assert len(fronts[0].values()) == row_width()
    other.close()
    board.close()


@given(st.integers(1, 5000), st.integers(1, 64))
def test_the_queue_split_adds_up_to_max_queue(max_queue, fronts):
    shares = [front_share(max_queue, fronts, front) for front in range(fronts)]
    assert sum(shares) == max_queue and max(shares) - min(shares) <= 1


@pytest.mark.parametrize("fields, words", [
    ({"api_servers": 0}, "serve.api_servers must be a whole number in [1, 64]"),
    ({"api_servers": True}, "serve.api_servers must be a whole number"),
    ({"api_servers": 65}, "serve.api_servers"),
    ({"api_servers": 4, "max_queue": 3}, "serve.max_queue must be >= serve.api_servers (4"),
])
def test_api_servers_refuses_what_cannot_run(fields, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("(", r"\(")):
        ServeConfig(**fields)


def _scrape(client: httpx.Client, base: str) -> tuple[int, dict[str, float]]:
    """(the answering front, its /metrics) over one connection, so both come from one process."""
    front = client.get(f"{base}/internal/state").json()["api_server"]
    text = client.get(f"{base}/metrics").text
    return front, {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def _fronts_seen(base: str, expected: dict[str, float], fronts: int) -> set[int]:
    """Scrape over fresh connections until every front answered; each must give the server's counts."""
    seen: set[int] = set()
    for _ in range(200):
        with httpx.Client() as client:
            front, values = _scrape(client, base)
        assert {name: values[name] for name in expected} == expected, f"front {front}"
        seen.add(front)
        if len(seen) == fronts:
            break
    return seen


def test_three_fronts_serve_every_request_and_count_them_all():
    server = start_server([*SIM, "serve.time_scale=20", "serve.api_servers=3"])
    base = f"http://127.0.0.1:{server.port}"
    try:
        bodies = [{"model": MODEL, "prompt": f"front {i}", "max_tokens": 3 + i % 4, "stream": True,
                   "ignore_eos": True} for i in range(30)]
        assert asyncio.run(count_streams(f"{base}/v1", bodies)) == [4 + i % 4 for i in range(30)]
        plain = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "plain", "max_tokens": 4,
                                                           "ignore_eos": True}, timeout=30).json()
        assert plain["usage"]["completion_tokens"] == 4
        tokens = sum(3 + i % 4 for i in range(30)) + 4
        expected = {"vllm:generation_tokens_total": tokens, "vllm:request_success_total": 31,
                    "harness:num_requests_live": 0}
        assert _fronts_seen(base, expected, 3) == {0, 1, 2}
    finally:
        outcome = server.stop()
    assert len(outcome.requests) == 31 and (outcome.requests["finish_reason"] == "length").all()
    assert outcome.requests["first_sent"].notna().all()  # every front's HTTP times are in
    row = outcome.overhead.iloc[0]
    assert row["api_servers"] == 3 and row["tokens"] == tokens and row["http_cpu_us_per_token"] > 0


def _front_pids(parent: int) -> list[int]:
    tasks = Path(f"/proc/{parent}/task").iterdir()  # the server's thread started them
    children = [pid for task in tasks for pid in (task / "children").read_text().split()]
    return [int(pid) for pid in children if b"harness.serve.front" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def _live_and_blocks(base: str) -> tuple[float, float]:
    with httpx.Client() as client:
        _, values = _scrape(client, base)
    return values["harness:num_requests_live"], values["harness:kv_cache_used_blocks"]


def _open_streams(stack: ExitStack, base: str, count: int) -> list:
    """count streams, each on a connection of its own (the kernel spreads them over the fronts)."""
    body = {"model": MODEL, "prompt": "a long answer please", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    lines = []
    for _ in range(count):
        client = stack.enter_context(httpx.Client(timeout=30))
        response = stack.enter_context(client.stream("POST", f"{base}/v1/completions", json=body))
        lines.append(response.iter_lines())
        assert next(lines[-1]).startswith("data: ")
    return lines


def test_disconnects_and_a_dead_front_leave_no_request_or_block_behind():
    server = start_server([*SIM, "serve.time_scale=1", "serve.api_servers=2"])
    base = f"http://127.0.0.1:{server.port}"
    try:
        with ExitStack() as stack:
            streams = _open_streams(stack, base, 4)  # kept: a line iterator closes its response when dropped
            assert _live_and_blocks(base)[0] == len(streams)
        _until(lambda: _live_and_blocks(base) == (0, 0))
        # a front killed mid-stream: the core aborts its requests, front 0's streams go on
        with ExitStack() as stack:
            streams = _open_streams(stack, base, 16)  # all 16 on front 0: one chance in 65,536
            (victim,) = _front_pids(os.getpid())
            os.kill(victim, signal.SIGKILL)
            _until(lambda: _running(base) < len(streams))
            survivors = _running(base)
            time.sleep(0.3)  # front 0's requests run on, streamed
            assert 0 < _running(base) == survivors and _live_and_blocks(base)[0] == survivors
        _until(lambda: _live_and_blocks(base) == (0, 0))
        after = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "after", "max_tokens": 3,
                                                           "ignore_eos": True}, timeout=30)
        assert after.json()["usage"]["completion_tokens"] == 3
    finally:
        outcome = server.stop()
    assert (outcome.requests["finish_reason"] == "aborted").sum() == 20


def _running(base: str) -> float:
    with httpx.Client() as client:
        return _scrape(client, base)[1]["vllm:num_requests_running"]


def _until(done, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_the_first_process_refuses_a_port_in_use_and_the_others_join_it():
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # another program's, sharing allowed
    other.bind(("127.0.0.1", 0))
    other.listen()
    with pytest.raises(OSError, match="cannot listen on 127.0.0.1:.* in use"):
        listening_socket("127.0.0.1", other.getsockname()[1], first=True)
    other.close()
    first = listening_socket("127.0.0.1", 0, first=True)
    port = first.getsockname()[1]
    second = listening_socket("127.0.0.1", port)  # another HTTP process of the same server
    assert second.getsockname()[1] == port
    first.close()
    second.close()


def test_the_cpu_per_token_counts_every_token_sent_not_the_lags_kept():
    requests = pd.DataFrame({"finish_reason": ["length"], **{c: [0.1] for c in
                             ("http_in", "first_token_out", "overhead_s", "http_ttft", "ttft")}})
    row = overhead_summary(requests, [0.0] * 3, [0.001] * 3, [1e-5], 1.0, http_cpu_s=1e-3, api_servers=2,
                           tokens_sent=10).iloc[0]
    assert row["tokens"] == 10 and row["http_cpu_us_per_token"] == pytest.approx(100.0)
    assert row["send_lag_max_ms"] == pytest.approx(1.0) and row["api_servers"] == 2


def test_each_process_holds_its_share_of_max_queue_and_its_503_says_so():
    server = start_server([*SIM, "serve.time_scale=1", "serve.api_servers=2", "serve.max_queue=2"])
    url = f"http://127.0.0.1:{server.port}/v1/completions"
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    try:
        with ExitStack() as stack:
            statuses, refusals = [], []
            for _ in range(3):  # each on a connection of its own; every process holds one at most
                response = stack.enter_context(stack.enter_context(httpx.Client(timeout=30)).stream(
                    "POST", url, json=body))
                statuses.append(response.status_code)
                if response.status_code == 503:
                    refusals.append(json.loads(response.read())["error"]["message"])
            assert statuses.count(200) <= 2 and statuses.count(503) >= 1
            assert all("its share of serve.max_queue=2 over serve.api_servers=2" in m for m in refusals)
    finally:
        server.stop()
