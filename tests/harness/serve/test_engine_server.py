"""The engine-backed server on the tiny CPU model gives LLM.generate's greedy tokens, with steps
overlapped (each step's tokens then sent by the core's token sender, harness.serve.handoff, or with
serve.early_tokens=false by the loop) or not, and behind two HTTP processes (serve.api_servers=2: the
core process sends each its own requests' tokens, harness.serve.wire.FanChannel)."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.core.sampling_params import SamplingParams
from engine.llm import LLM
from tests.harness.serve.conftest import start_server

PROMPT = "The scheduler pauses a request"


@pytest.fixture(scope="module")
def greedy_reference(tiny_checkpoint):
    """LLM.generate's greedy answer to PROMPT, which both of the server's settings must give."""
    llm = LLM(str(tiny_checkpoint), device="cpu", max_model_len=256, block_size=16, num_blocks=64)
    want = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)[0]
    llm.shutdown()
    return want


# The default run serves the default settings behind two HTTP processes (the core process and its
# fan-out); one process, the loop's own sends and the steps one at a time (each a server start,
# 5-7 s on 2 cores) are in the slow suite.
@pytest.mark.parametrize("overlap,early,api_servers", [
    pytest.param("false", "true", 1, marks=pytest.mark.slow), pytest.param("true", "true", 1, marks=pytest.mark.slow),
    pytest.param("true", "false", 1, marks=pytest.mark.slow), ("true", "true", 2)])
def test_engine_server_matches_llm_generate_greedy(tiny_checkpoint, greedy_reference, overlap, early, api_servers):
    want = greedy_reference
    server = start_server(["model=tiny-qwen3", "hardware=cpu", "backend=engine", "backend.device=cpu",
                           f"backend.model={tiny_checkpoint}", "scheduler.max_model_len=256", "cache.block_size=16",
                           "cache.num_blocks=64", f"execution.async_scheduling={overlap}",
                           f"serve.early_tokens={early}", f"serve.api_servers={api_servers}"])
    rounds = 1 if api_servers == 1 else 4  # each request a connection: with two processes, most likely both serve
    try:
        for _ in range(rounds):
            _plain_and_streamed(server.port, want, tiny_checkpoint.name)
    finally:
        outcome = server.stop()
    assert len(outcome.requests) == 2 * rounds
    assert list(outcome.requests["output_tokens"]) == [len(want.token_ids)] * 2 * rounds
    assert outcome.requests["first_sent"].notna().all()


def _plain_and_streamed(port: int, want, checkpoint_name: str) -> None:
    """A plain and a streamed request each give want's greedy tokens and text."""
    url = f"http://127.0.0.1:{port}/v1/completions"
    model = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
    assert model == checkpoint_name  # the checkpoint folder's name
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    plain = httpx.post(url, json=body, timeout=60).json()
    assert plain["choices"][0]["token_ids"] == want.token_ids
    assert plain["choices"][0]["text"] == want.text
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line[6:]) for line in lines]
    assert "".join(c["choices"][0]["text"] for c in chunks) == want.text
    assert chunks[-1]["choices"][0]["token_ids"] == want.token_ids
