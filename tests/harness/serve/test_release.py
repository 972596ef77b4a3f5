"""The HTTP side's token path (harness.serve.core, harness.serve.sse): the simulator's steps arrive
ahead of their time and are handed out when due, every step due at once in one pass; a stream
writes once per pass whatever the steps it covers, and a write the server cannot take at once is
followed by what came meanwhile, in one write."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from engine.core.request import FinishReason
from engine.core.sampling_params import SamplingParams
from harness.serve.config import ServeConfig
from harness.serve.core import CoreSnapshot, Delivery, ServeCore
from harness.serve.generation import Generation
from harness.serve.metrics import ServerMetrics
from harness.serve.sse import DirectWriter, Events


class Words:
    def add(self, ids: list[int]) -> str:
        return "".join(f" w{i}" for i in ids)


def generation(core, max_tokens: int = 10) -> Generation:
    metrics = ServerMetrics(SimpleNamespace(snapshot=CoreSnapshot()), "m")
    return Generation(core, SimpleNamespace(decoder=Words), metrics, [1, 2, 3], SamplingParams(max_tokens=max_tokens),
                      [])


def serve_core() -> ServeCore:
    core = ServeCore(None, 1.0, 16)  # type: ignore[arg-type]  # no process: messages are fed by hand
    core.num_blocks = 100
    core._loop = asyncio.get_running_loop()
    core._wire = SimpleNamespace(send=lambda message: None)  # type: ignore[assignment]
    core._proc = SimpleNamespace(poll=lambda: None)  # type: ignore[assignment]
    return core


def test_steps_sent_ahead_wait_for_their_time_and_late_ones_go_out_together():
    async def scenario():
        core = serve_core()
        calls: list[tuple[float, float, list[int]]] = []  # (when, due, tokens)
        core._sinks["a"] = lambda d: calls.append((time.perf_counter(), d.due, d.token_ids))
        now = time.perf_counter()
        for k in range(3):  # sent 20, 30 and 40 ms ahead
            core._on_message(("step", now + 0.02 + 0.01 * k, [("a", [k], None, 0)], (1, 0, k)))
        await asyncio.sleep(0.08)
        assert [c[2] for c in calls] == [[0], [1], [2]]
        assert all(when >= due for when, due, _ in calls)  # never before its time
        assert core.snapshot.used_blocks == 2
        # two steps already late when read: one pass, so a stream gets both before it writes
        passes: list[int] = []
        one_pass = core._pass
        core._pass = lambda messages: (passes.append(len(messages)), one_pass(messages))  # type: ignore[method-assign]
        late = time.perf_counter() - 0.01
        core._on_message(("step", late, [("a", [3], None, 0)], (1, 0, 3)))
        core._on_message(("step", late + 0.001, [("a", [4], None, 0)], (1, 0, 4)))
        await asyncio.sleep(0.01)
        assert [c[2] for c in calls[3:]] == [[3], [4]] and core.snapshot.used_blocks == 4
        assert passes == [2]

    asyncio.run(scenario())


class Socket:
    """An ASGI send that takes bodies at once, except the first `hold` ones, which wait for `open`."""

    def __init__(self, hold: int = 0) -> None:
        self.bodies: list[bytes] = []
        self.hold = hold
        self.open = asyncio.get_running_loop().create_future()

    async def __call__(self, message: dict) -> None:
        if self.hold:
            self.hold -= 1
            await self.open
        self.bodies.append(message["body"])


def events_of(body: bytes) -> list[bytes]:
    return [e for e in body.split(b"\n\n") if e]


def test_a_stream_writes_once_per_pass_and_after_a_waiting_write_in_one_piece():
    async def scenario():
        core = serve_core()
        gen = generation(core, max_tokens=6)
        gen.submit()
        socket = Socket(hold=1)
        writer = DirectWriter(socket, gen, Events({"id": "x", "created": 0, "model": "m"}, False, False, False))
        deliver = gen._receive

        def step(ids: list[int], reason: FinishReason | None = None) -> Delivery:
            return Delivery(ids, reason, time.perf_counter())

        core._pass([("tokens", 0.0, [])])  # an empty pass writes nothing
        deliver(step([0]))  # outside a pass: written at once, and that write waits
        assert socket.bodies == [] and writer._task is not None
        core._flushes = []
        for k in (1, 2):  # one pass over two steps: queued behind the waiting write
            deliver(step([k]))
        flushes, core._flushes = core._flushes, None
        for flush in flushes:
            flush()
        deliver(step([3]))
        socket.open.set_result(None)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert [len(events_of(b)) for b in socket.bodies] == [1, 3]  # the waiting one, then the rest at once
        deliver(step([4, 5], FinishReason.LENGTH))
        await asyncio.wait_for(writer.finished, 1)
        closing = events_of(socket.bodies[-1])
        assert closing[-1] == b"data: [DONE]" and b'"finish_reason": "length"' in closing[-2]
        text = b"".join(socket.bodies).decode()
        assert [f"w{i}" in text for i in range(6)] == [True] * 6
        assert gen.times.send_lag_tokens == 6 and gen.output_ids == [0, 1, 2, 3, 4, 5]

    asyncio.run(scenario())


def test_a_client_that_goes_away_aborts_its_request_and_its_waiting_write():
    async def scenario():
        core = serve_core()
        aborted: list[str] = []
        core.abort = aborted.append  # type: ignore[method-assign]
        gen = generation(core)
        gen.submit()
        socket = Socket(hold=1)
        writer = DirectWriter(socket, gen, Events({"id": "x", "created": 0, "model": "m"}, True, False, False))
        gen._receive(Delivery([7], None, time.perf_counter()))
        task = writer._task
        writer.close()
        await asyncio.sleep(0)
        assert aborted == [gen.request_id] and task is not None and task.cancelled()
        assert writer.finished.cancelled() and gen.direct is None and gen.encode is None

    asyncio.run(scenario())


def test_a_write_that_waits_while_the_loop_runs_finishes_when_the_socket_takes_it():
    """The ASGI send stops at a future (flow control); the task that finishes it runs while the
    future is still pending, as under a slow client."""
    async def scenario():
        from harness.serve.sse import write_now

        socket = Socket(hold=1)
        task = write_now(socket, {"type": "http.response.body", "body": b"x", "more_body": True})
        assert task is not None
        await asyncio.sleep(0.005)  # the task awaits the pending future
        socket.open.set_result(None)
        await asyncio.wait_for(task, 1)
        assert socket.bodies == [b"x"]

    asyncio.run(scenario())


def _held_by_hand(core: ServeCore, due: float, count: int = 3) -> None:
    """A step of count deliveries to "a", held, its timer cancelled: released only by hand."""
    core._on_message(("step", due, [("a", [k], None, 0) for k in range(count)], (1, 0, 0)))
    assert core._timer is not None
    core._timer.cancel()
    core._timer = None


def test_a_step_starts_its_writes_time_before_it_and_never_more_than_max_early():
    async def scenario():
        core = serve_core()
        lags: list[float] = []
        core._sinks["a"] = lambda d: lags.append(time.perf_counter() - d.due)
        core._write_s = 1e-4  # as if measured: 0.1 ms per delivery
        core.max_early_s = 2e-3
        message = ("step", 1.0, [("a", [k], None, 0) for k in range(3)], (1, 0, 0))
        assert core._release_at(message) == 1.0 - 3e-4  # the writes' expected time
        core._write_s = 1e-3
        assert core._release_at(message) == 1.0 - 2e-3  # capped at max_early_s
        _held_by_hand(core, time.perf_counter() + 1.5e-3)
        core._release()  # due in 1.5 ms, released 2 ms before it: at once
        assert len(lags) == 3 and -2e-3 <= lags[0] < 0
        core.max_early_s = 0.0  # none before their time: slept to, a slice at a time, between the loop's work
        _held_by_hand(core, time.perf_counter() + 1.5e-3)
        core._release()
        for _ in range(200):
            if len(lags) == 6:
                break
            await asyncio.sleep(1e-4)
        assert len(lags) == 6 and lags[3] >= 0
        _held_by_hand(core, time.perf_counter() + 0.01)
        core._release()  # not due within the timer's slack: held, on a timer again
        assert len(lags) == 6 and len(core._held) == 1 and core._timer is not None

    asyncio.run(scenario())


@pytest.mark.parametrize("value", [-0.5, 10.5])
def test_serve_max_early_ms_outside_its_range_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"serve.max_early_ms must be in \[0, 10\]"):
        ServeConfig(max_early_ms=value)


def test_a_held_steps_gauges_never_overwrite_a_newer_snap():
    """An abort's snap (blocks freed) can arrive while a step sent before it is still held: when
    that step is handed out, its older gauges must not bring the freed blocks back."""
    async def scenario():
        core = serve_core()
        core._sinks["a"] = lambda delivery: None
        core._on_message(("step", time.perf_counter() + 0.02, [("a", [1], None, 0)], (1, 0, 7)))  # held
        core._sinks.pop("a")  # the client went away: the core aborted it and says so at once
        core._on_message(("snap", (0, 0, 0)))
        assert core.snapshot.used_blocks == 0
        await asyncio.sleep(0.05)  # the held step is handed out meanwhile
        assert not core._held
        assert (core.snapshot.running, core.snapshot.used_blocks, core.snapshot.kv_usage) == (0, 0, 0.0)
        # a step sent after the snap sets the gauges again
        core._on_message(("step", time.perf_counter(), [], (2, 1, 9)))
        await asyncio.sleep(0.01)
        assert (core.snapshot.running, core.snapshot.waiting, core.snapshot.used_blocks) == (2, 1, 9)

    asyncio.run(scenario())
