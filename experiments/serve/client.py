"""An in-repo streaming client that replays a workload's requests at their arrival times.

The device image has neither the openai client nor aiperf nor httpx's async stack to rely on, so
the GPU benchmark drives the servers with this: the standard library's asyncio, one HTTP/1.1
connection per request (`Connection: close`), `POST /v1/completions` with the request's prompt
token ids, max_tokens, temperature, seed and ignore_eos, streamed with `return_token_ids` (every
delivery of tokens is an event, whether or not it adds text) and `include_usage`.

It parses as little as it can, so that its own CPU per token (a read, two bytes.count) stays far
below the server's and its timestamps are the server's, not a busy client's: a token event is an
SSE event whose finish_reason is null (counted in each read, a tail carried across reads), the
usage event at the end gives the token count, the first event the server's request id. Per request
on the client's clock: TTFT (the request's start, before the connection, to the read that held the
first token event) and the mean inter-token latency ((last - first) / (tokens - 1), as aiperf and
the harness's tpot define it); `late_s` says how far behind its arrival time the request started
(a client that kept up has it near 0).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from engine.core.request import Request

_TOKEN_EVENT = b'"finish_reason": null'
_ID = re.compile(rb'"id": "(?:cmpl|chatcmpl)-(\w+)"')
_USAGE = re.compile(rb'"completion_tokens": (\d+)')


@dataclass
class ClientRecord:
    ttft_s: float
    itl_s: float | None  # None for a single-token answer
    tokens: int
    late_s: float = 0.0  # started this long after its arrival time
    request_id: str = ""  # the server's (its requests.csv's request_id)
    error: str | None = None


def request_body(model: str, request: Request) -> dict:
    params = request.sampling_params
    body = {"model": model, "prompt": request.token_ids[:request.num_prompt_tokens],
            "max_tokens": params.max_tokens, "temperature": params.temperature, "ignore_eos": params.ignore_eos,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


async def stream_one(base_url: str, body: dict, started: float, late_s: float = 0.0) -> ClientRecord:
    """POST body to base_url/completions and time its token events; started: the request's start."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    data = json.dumps(body).encode()
    writer.write(f"POST {url.path}/completions HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    first = last = None
    head = tail = b""
    keep = len(_TOKEN_EVENT) - 1
    try:
        status = await reader.readline()
        if not status.startswith(b"HTTP/1.1 200"):
            text = (await reader.read()).decode(errors="replace")  # Connection: close: to the end
            return ClientRecord(float("nan"), None, 0, late_s, error=f"{status.decode().strip()}: {text[-300:]}")
        while chunk := await reader.read(1 << 16):
            now = time.perf_counter()
            buffer = tail[-keep:] + chunk
            if buffer.count(_TOKEN_EVENT):
                last = now
                first = first or now
            if len(head) < 4096:
                head += chunk
            tail = (tail + chunk)[-4096:]  # the usage event is the last but one
    finally:
        writer.close()
    match, usage = _ID.search(head), _USAGE.findall(tail)
    rid = match.group(1).decode() if match else ""
    if first is None or last is None or not usage:
        return ClientRecord(float("nan"), None, 0, late_s, rid, "no token or no usage came back")
    tokens = int(usage[-1])
    return ClientRecord(first - started, (last - first) / (tokens - 1) if tokens > 1 else None, tokens, late_s, rid)


async def _timed(base_url: str, model: str, request: Request, start: float) -> ClientRecord:
    due = start + request.arrival_time
    await asyncio.sleep(max(due - time.perf_counter(), 0.0))
    started = time.perf_counter()
    try:
        return await stream_one(base_url, request_body(model, request), started, started - due)
    except OSError as error:
        return ClientRecord(float("nan"), None, 0, started - due, error=repr(error))


async def replay(base_url: str, model: str, requests: list[Request]) -> list[ClientRecord]:
    """Every request sent at its arrival time (seconds after the first), all streamed at once."""
    start = time.perf_counter() + 0.05 - min(r.arrival_time for r in requests)
    return list(await asyncio.gather(*(_timed(base_url, model, r, start) for r in requests)))
