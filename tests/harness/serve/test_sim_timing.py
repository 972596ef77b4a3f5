"""The simulator-backed server keeps to its schedule under 200 concurrent streams at time_scale=1."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.harness.serve.conftest import SIM, start_server

STREAMS = 200


@pytest.mark.slow
@pytest.mark.xfail(reason="measured P99 lag 564 ms on a 2-core shared box with the 200 clients in the server's own "
                   "process (one GIL); the 5 ms target needs the clients in another process: not yet met", strict=False)
def test_200_streams_lag_p99_within_5ms():
    server = start_server([*SIM, "serve.time_scale=1", "serve.max_queue=512"])
    url = f"http://127.0.0.1:{server.port}/v1/completions"

    async def main() -> None:
        limits = httpx.Limits(max_connections=STREAMS + 10)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            async def one(i: int) -> int:
                body = {"model": "qwen3-8b", "prompt": f"stream {i} " * 20, "max_tokens": 200, "stream": True,
                        "ignore_eos": True}
                n = 0
                async with client.stream("POST", url, json=body) as response:
                    async for line in response.aiter_lines():
                        n += line.startswith("data: {")
                return n

            counts = await asyncio.gather(*(one(i) for i in range(STREAMS)))
            assert min(counts) >= 200

    try:
        asyncio.run(main())
        state = httpx.get(f"http://127.0.0.1:{server.port}/internal/state").json()
    finally:
        server.stop()
    print(f"lag over {state['lag_tokens']} tokens: P50 {state['lag_p50_s'] * 1e3:.2f} ms, "
          f"P99 {state['lag_p99_s'] * 1e3:.2f} ms, max {state['lag_max_s'] * 1e3:.2f} ms")
    assert state["lag_tokens"] == STREAMS * 200
    assert state["lag_p99_s"] <= 0.005
