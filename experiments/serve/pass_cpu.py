"""The HTTP side's pass over one simulated step of 200 streams, in CPU time: where in the pass each
stream's event reaches its socket. A load-independent view of the 200-stream send lag
(tests/harness/serve/test_sim_timing.py), whose wall times on a shared machine mostly measure the
wait for a core.

    python -m experiments.serve.pass_cpu            # this checkout
    cd /tmp/base && python -m experiments.serve.pass_cpu   # a checkout before a change (copy this file there)

In this process: a ServeCore without a core process (steps fed by hand, each due 4 ms after it
arrives, as the simulator's arrive a step ahead), 200 Generation + DirectWriter streams (the
simulator's word codec) whose ASGI send frames the chunk and writes it to a real loopback TCP
connection, as uvicorn's does; a child process reads the 200 connections. Printed: the thread CPU
time from the pass's start to each write (P1, P50, P99 over streams and steps: the send lag of a
server that has a core when the step is due), the pass's CPU in all and per token, and the wall
send lag of this run (which the machine's load sets).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

STREAMS, STEPS, WARMUP = 200, 300, 50


def _reader(port: int) -> None:
    async def main() -> None:
        async def one() -> None:
            reader, _ = await asyncio.open_connection("127.0.0.1", port)
            while await reader.read(1 << 16):
                pass

        await asyncio.gather(*(one() for _ in range(STREAMS)))

    asyncio.run(main())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e3


async def _connect(loop: asyncio.AbstractEventLoop) -> tuple[list, subprocess.Popen]:
    """STREAMS loopback TCP connections, each read by the child process (_reader)."""
    transports: list = []
    connected = asyncio.Event()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            transports.append(transport)
            if len(transports) == STREAMS:
                connected.set()

    server = await loop.create_server(Accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    child = subprocess.Popen([sys.executable, "-m", "experiments.serve.pass_cpu", str(port)])
    await connected.wait()
    return transports, child


async def _main() -> None:
    from engine.core.sampling_params import SamplingParams
    from harness.serve.core import CoreSnapshot, ServeCore
    from harness.serve.generation import Generation
    from harness.serve.metrics import ServerMetrics
    from harness.serve.sse import DirectWriter, Events
    from harness.serve.text import WordCodec

    loop = asyncio.get_running_loop()
    transports, child = await _connect(loop)
    core = ServeCore(None, 1.0, 4 * STREAMS)  # type: ignore[arg-type]
    core.num_blocks, core._loop = 100, loop
    core._wire = SimpleNamespace(send=lambda message: None)  # type: ignore[assignment]
    core._proc = SimpleNamespace(poll=lambda: None)  # type: ignore[assignment]
    codec, metrics = WordCodec(), ServerMetrics(SimpleNamespace(snapshot=CoreSnapshot()), "qwen3-8b")  # type: ignore[arg-type]
    offsets: list[float] = []
    pass_start = [0.0]
    gens = []
    for transport in transports:
        async def send(message: dict, transport=transport) -> None:
            body = message.get("body", b"")
            transport.write(b"".join([b"%x\r\n" % len(body), body, b"\r\n"]))
            offsets.append(time.thread_time() - pass_start[0])

        gen = Generation(core, codec, metrics, [1, 2, 3], SamplingParams(max_tokens=10 * STEPS), [])
        gen.submit()
        DirectWriter(send, gen, Events({"id": f"cmpl-{gen.request_id}", "created": 0, "model": "qwen3-8b"},
                                       False, False, False))
        gens.append(gen)
    gc.freeze()
    cpus: list[float] = []
    for k in range(STEPS):
        due = time.perf_counter() + 0.004
        core._on_message(("step", due, [(g.request_id, [1000 + 7 * k + i], None, 0) for i, g in enumerate(gens)],
                          (STREAMS, 0, 1)))
        if core._timer is not None:  # released by hand, at its time
            core._timer.cancel()
            core._timer = None
        await asyncio.sleep(max(due - time.perf_counter() - 0.001, 0))
        while time.perf_counter() < due:
            pass
        if k == WARMUP:
            offsets.clear()
            core.send_lags.clear()
        pass_start[0] = time.thread_time()
        core._release()
        if k >= WARMUP:
            cpus.append(time.thread_time() - pass_start[0])
        await asyncio.sleep(0.006)
    for transport in transports:
        transport.close()
    await asyncio.to_thread(child.wait)
    lags = list(core.send_lags)
    print(f"{STREAMS} streams x {STEPS - WARMUP} steps: CPU from the pass's start to a stream's write P1 "
          f"{_pct(offsets, 0.01):.2f} P50 {_pct(offsets, 0.5):.2f} P99 {_pct(offsets, 0.99):.2f} ms; pass CPU "
          f"{statistics.median(cpus) * 1e3:.2f} ms ({statistics.median(cpus) / STREAMS * 1e6:.1f} us/token); "
          f"wall send lag P50 {_pct(lags, 0.5):.2f} P99 {_pct(lags, 0.99):.2f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _reader(int(sys.argv[1]))
    else:
        import uvloop

        uvloop.run(_main())
