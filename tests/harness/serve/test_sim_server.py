"""The simulator-backed server driven by the official openai client and by raw HTTP."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.serve.app import Server
from harness.serve.config import ServeConfig
from harness.serve.overhead import HTTP_COLUMNS
from tests.harness.serve.conftest import SIM, start_server

MODEL = "qwen3-8b"


def client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_completions_and_chat_streaming_and_not(sim_server):
    c = client(sim_server.port)
    assert [m.id for m in c.models.list().data] == [MODEL]
    out = c.completions.create(model=MODEL, prompt="The sea is wide", max_tokens=7, temperature=0)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 7
    assert out.choices[0].text.strip()
    chunks = list(c.completions.create(model=MODEL, prompt="The sea is wide", max_tokens=7, stream=True,
                                       stream_options={"include_usage": True}))
    # the simulator's tokens hash the request id: same count, other words (one word per token)
    streamed = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert len(streamed.split()) == 7 == len(out.choices[0].text.split())
    assert chunks[-1].usage.completion_tokens == 7 and chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 4
    stream = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert len("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices).split()) == 4
    assert stream[-1].usage.total_tokens == chat.usage.total_tokens
    # stop strings end the text before them; min_tokens/ignore_eos/top_k/seed are accepted
    cut = c.completions.create(model=MODEL, prompt="The sea is wide", max_tokens=200, stop=["e", "zz"],
                               extra_body={"ignore_eos": True, "min_tokens": 2, "top_k": 5}, seed=1)
    assert cut.choices[0].finish_reason == "stop" and "e" not in cut.choices[0].text
    assert cut.usage.completion_tokens < 200


def test_concurrent_streams_all_finish(sim_server):
    async def main() -> list[int]:
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{sim_server.port}/v1", api_key="none", max_retries=0)

        async def one(i: int) -> int:
            n = 0
            async for chunk in await c.completions.create(model=MODEL, prompt=f"request {i}", max_tokens=5 + i % 7,
                                                          stream=True, stream_options={"include_usage": True}):
                if chunk.usage:
                    n = chunk.usage.completion_tokens
            return n

        return await asyncio.gather(*(one(i) for i in range(40)))

    assert asyncio.run(main()) == [5 + i % 7 for i in range(40)]
    outcome = sim_server.stop()
    assert len(outcome.requests) == 40 and (outcome.requests["finish_reason"] == "length").all()
    assert outcome.summary.num_requests == 40 and len(outcome.steps) > 0


def test_disconnect_mid_stream_frees_request_and_blocks(sim_server):
    port = sim_server.port
    body = {"model": MODEL, "prompt": "a long answer please", "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
        assert metrics(port)["harness:num_requests_live"] == 1
    for _ in range(200):  # the abort reaches the loop thread between steps; its blocks are freed there
        state = httpx.get(f"http://127.0.0.1:{port}/internal/state").json()
        if state["live"] == 0 and state["used_blocks"] == 0 and state["running"] == 0:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert state["live"] == 0 and state["used_blocks"] == 0 and state["running"] == 0
    values = metrics(port)
    assert values["vllm:num_requests_running"] == 0 and values["vllm:kv_cache_usage_perc"] == 0
    outcome = sim_server.stop()
    assert list(outcome.requests["finish_reason"]) == ["aborted"]


@pytest.mark.parametrize("body, status, words", [
    ('{"model": "qwen3-8b", "prompt": ', 400, "not valid JSON"),
    ('{"model": "qwen3-8b", "prompt": "x", "frobnicate": 1}', 400, "unknown field 'frobnicate'"),
    ('{"model": "qwen3-8b", "prompt": "x", "n": 2}', 400, "n=1"),
    ('{"model": "qwen3-8b", "prompt": "x", "temperature": -1}', 400, "temperature"),
    ('{"model": "qwen3-8b", "prompt": "x", "max_tokens": 5000}', 400, "max_model_len"),
    ('{"model": "qwen3-8b", "prompt": "' + "word " * 5000 + '"}', 400, "max_model_len"),
    ('{"model": "other", "prompt": "x"}', 404, "not served here"),
    ('{"model": "qwen3-8b", "prompt": "x", "stop_token_ids": [-5]}', 400, "stop_token_ids.0"),
    # logprobs=0 asks for the sampled token's log-probability, which this server does not give
    ('{"model": "qwen3-8b", "prompt": "x", "logprobs": 0}', 400, "logprobs: not supported"),
    ('{"model": "qwen3-8b", "prompt": "x", "presence_penalty": 0.5}', 400, "presence_penalty: not supported"),
    # a field of several accepted types is named as the field, not as one of its types (prompt.str)
    ('{"model": "qwen3-8b", "prompt": ["a", "b"]}', 400, "prompt: matches none of"),
    # a whole answer has no last chunk to carry the usage
    ('{"model": "qwen3-8b", "prompt": "x", "stream_options": {"include_usage": true}}', 400,
     "stream_options is read only with stream=true"),
])
def test_bad_requests_answer_4xx_and_the_server_goes_on(shared_sim_server, body, status, words):
    url = f"http://127.0.0.1:{shared_sim_server.port}/v1/completions"
    response = httpx.post(url, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status
    assert words in response.json()["error"]["message"]
    if status == 400 and ":" in words:  # a field named in the message is the error's param too
        assert response.json()["error"]["param"] == words.split(":")[0]
    ok = httpx.post(url, json={"model": MODEL, "prompt": "still here", "max_tokens": 3})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_a_server_fault_answers_500_in_openai_shape(sim_server, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the admission check broke")

    monkeypatch.setattr(Server, "generation", broken)
    response = httpx.post(f"http://127.0.0.1:{sim_server.port}/v1/completions",
                          json={"model": MODEL, "prompt": "x", "max_tokens": 3})
    assert response.status_code == 500
    assert response.json()["error"] == {"message": "RuntimeError: the admission check broke", "type": "server_error",
                                        "param": None, "code": 500}


@pytest.mark.parametrize("stop", ["", [""]])
@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_stop_string_stops_nothing(shared_sim_server, stop, stream):
    c = client(shared_sim_server.port)
    out = c.completions.create(model=MODEL, prompt="x", max_tokens=5, stop=stop, stream=stream,
                               **({"stream_options": {"include_usage": True}} if stream else {}))
    chunks = list(out) if stream else [out]
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 5 == len(text.split())


def test_openai_client_raises_on_bad_request(shared_sim_server):
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client(shared_sim_server.port).completions.create(model=MODEL, prompt="x", n=2)


def test_full_queue_answers_503():
    server = start_server([*SIM, "serve.time_scale=1", "serve.max_queue=2"])
    try:
        url = f"http://127.0.0.1:{server.port}/v1/completions"
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", url, json=body, timeout=30) as first, \
                httpx.stream("POST", url, json=body, timeout=30) as second:
            assert first.status_code == second.status_code == 200
            third = httpx.post(url, json={**body, "stream": False})
            assert third.status_code == 503 and "max_queue=2" in third.json()["error"]["message"]
    finally:
        server.stop()


def test_metrics_parse_with_vllm_names(sim_server):
    client(sim_server.port).completions.create(model=MODEL, prompt="count me", max_tokens=4)
    values = metrics(sim_server.port)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "harness:token_release_lag_seconds_count"):
        assert name in values, name
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert values["vllm:inter_token_latency_seconds_count"] == 3
    assert values["vllm:generation_tokens_total"] == 4


def test_outputs_state_the_http_overhead_per_request_and_per_token(sim_server):
    c = client(sim_server.port)
    for i in range(3):
        list(c.completions.create(model=MODEL, prompt=f"overhead {i}", max_tokens=6, stream=True))
    c.completions.create(model=MODEL, prompt="not streamed", max_tokens=4)
    outcome = sim_server.stop()
    frame = outcome.requests
    assert len(frame) == 4 and frame[list(HTTP_COLUMNS)].notna().all().all()
    # the HTTP side has a request before the core does, and writes a token no earlier than
    # serve.max_early_ms (wall time; the frame's times are simulated) before the core made it
    early = ServeConfig().max_early_ms * 1e-3 * 20  # the fixture's time_scale
    assert (frame["http_arrival"] < frame["arrival"]).all()
    assert (frame["first_sent"] >= frame["first_token"] - early).all()
    assert (frame["http_ttft"] - frame["ttft"] - frame["overhead_s"]).abs().max() < 1e-9
    row = outcome.overhead.iloc[0]
    assert row["requests"] == 4 and row["tokens"] == 3 * 6 + 4
    assert 0 < row["send_lag_p50_ms"] <= row["send_lag_p99_ms"] and row["handoff_p50_us"] > 0


def test_send_lags_lists_each_streamed_token(sim_server):
    port = sim_server.port
    body = {"model": MODEL, "prompt": "count", "max_tokens": 5, "stream": True, "ignore_eos": True}

    async def stream(i: int) -> int:
        async with httpx.AsyncClient(timeout=30) as http:
            async with http.stream("POST", f"http://127.0.0.1:{port}/v1/completions",
                                   json={**body, "max_tokens": 5 + i}) as response:
                return len([line async for line in response.aiter_lines() if line.startswith("data: {")])

    async def streams() -> list[int]:
        return await asyncio.gather(*(stream(i) for i in range(3)))

    assert asyncio.run(streams()) == [6, 7, 8]  # a token's event each, and the finishing one
    lags = httpx.get(f"http://127.0.0.1:{port}/internal/send_lags").json()
    state = httpx.get(f"http://127.0.0.1:{port}/internal/state").json()
    assert len(lags) == 5 + 6 + 7 == state["send_lag_tokens"]
    assert max(lags) == pytest.approx(state["send_lag_max_s"]) and min(lags) == pytest.approx(state["send_lag_min_s"])


@pytest.mark.parametrize("default_max_tokens, want", [(50, 50), (256, 8 * 16 - 3 + 1)])
def test_a_request_without_max_tokens_gets_what_the_cache_can_serve(default_max_tokens, want):
    """A KV cache smaller than max_model_len: a request that gives no max_tokens is served with the
    default, capped by what the whole cache holds, not refused for max_model_len's room."""
    server = start_server([*SIM, "serve.time_scale=20", "cache.num_blocks=8", "cache.block_size=16",
                           f"serve.default_max_tokens={default_max_tokens}"])
    try:
        out = client(server.port).completions.create(model=MODEL, prompt=[1, 2, 3], extra_body={"ignore_eos": True})
        with pytest.raises(openai.BadRequestError) as refused:  # asked for more than the cache holds
            client(server.port).completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=200)
    finally:
        server.stop()
    assert out.usage.completion_tokens == want and out.choices[0].finish_reason == "length"
    assert refused.value.body["message"] == "the request needs 13 KV blocks (3 prompt + 200 output tokens) but the " \
                                           "whole cache has 8"
