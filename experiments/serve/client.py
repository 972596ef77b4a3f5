"""An in-repo streaming client that replays a workload's requests at their arrival times.

aiperf (the load generator of the CI tests) needs ~140 wheels the device image lacks, so the GPU
benchmark drives the servers with this: httpx streams to /v1/completions with the request's prompt
token ids, max_tokens, temperature and ignore_eos; per request it records, on the client's clock,
TTFT (send to the first event with text) and the mean inter-token latency ((last - first) /
(tokens - 1), as aiperf defines it).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from engine.core.request import Request


@dataclass
class ClientRecord:
    ttft_s: float
    itl_s: float | None  # None for a single-token answer
    tokens: int
    error: str | None = None


async def _one(client: httpx.AsyncClient, url: str, model: str, request: Request, start: float) -> ClientRecord:
    await asyncio.sleep(max(start + request.arrival_time - time.perf_counter(), 0.0))
    params = request.sampling_params
    body = {"model": model, "prompt": request.token_ids[:request.num_prompt_tokens], "max_tokens": params.max_tokens,
            "temperature": params.temperature, "ignore_eos": params.ignore_eos, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    sent = time.perf_counter()
    first = last = None
    tokens = 0
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            return ClientRecord(float("nan"), None, 0, f"{response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            # every event before the last is a delivery of tokens (return_token_ids: text or not)
            if event["choices"] and event["choices"][0].get("finish_reason") is None:
                last = time.perf_counter()
                first = first or last
    if first is None or last is None:
        return ClientRecord(float("nan"), None, tokens, "no token came back")
    return ClientRecord(first - sent, (last - first) / (tokens - 1) if tokens > 1 else None, tokens)


async def replay(base_url: str, model: str, requests: list[Request]) -> list[ClientRecord]:
    """Every request sent at its arrival time (seconds after the first), all streamed at once."""
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0)) as client:
        start = time.perf_counter() - min(r.arrival_time for r in requests)
        url = base_url + "/completions"
        return list(await asyncio.gather(*(_one(client, url, model, r, start) for r in requests)))
