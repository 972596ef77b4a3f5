"""Steps made ahead (harness.serve.delivery.Ahead): the simulator's steps arrive a step before their
time, their text and events are made then, and when a step is due every stream writes before any
delivery is handed out. The bytes, the text and the send times are those of the path without it."""

from __future__ import annotations

import asyncio
import gc
import time
from types import SimpleNamespace

from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine.core.request import FinishReason
from engine.core.sampling_params import SamplingParams
from harness.serve.core import CoreSnapshot
from harness.serve.delivery import Delivery
from harness.serve.generation import Generation
from harness.serve.metrics import ServerMetrics
from harness.serve.passes import WRITE_PASSES
from harness.serve.sse import DirectWriter, Events
from tests.harness.serve.test_release import Socket, generation, serve_core

HEAD = {"id": "x", "created": 0, "model": "m"}


def _streams(core, count: int, tokens: int, log: list[tuple[str, int]]):
    """count streams writing to recording sockets; log gets ("write", i) and ("sink", i) in order."""
    sockets, gens = [], []
    for i in range(count):
        gen = generation(core, max_tokens=tokens)
        gen.submit()
        receive = core._sinks[gen.request_id]
        core._sinks[gen.request_id] = lambda d, i=i, receive=receive: (log.append(("sink", i)), receive(d))
        socket = Socket()
        send = socket.__call__

        async def logged(message, i=i, send=send):
            log.append(("write", i))
            await send(message)

        DirectWriter(logged, gen, Events(HEAD, False, True, False))
        sockets.append(socket)
        gens.append(gen)
    return sockets, gens


async def _serve(ahead: bool, count: int = 3, tokens: int = 4):
    core = serve_core()
    log: list[tuple[str, int]] = []
    sockets, gens = _streams(core, count, tokens, log)
    if not ahead:
        core._prepares.clear()
    for k in range(tokens):  # each step sent 3 ms ahead of its time, as the core process does
        last = k == tokens - 1
        reason = FinishReason.LENGTH if last else None
        deliveries = [(g.request_id, [10 * k + i], reason, 0) for i, g in enumerate(gens)]
        core._on_message(("step", time.perf_counter() + 0.003, deliveries, (count, 0, k)))
        await asyncio.sleep(0.006)
    return sockets, gens, log


def test_a_step_made_ahead_writes_every_stream_first_and_the_same_bytes():
    async def scenario():
        sockets, gens, log = await _serve(ahead=True)
        plain_sockets, plain_gens, plain_log = await _serve(ahead=False)
        for i, gen in enumerate(gens):
            assert gen.output_ids == [i, 10 + i, 20 + i, 30 + i]
        for made, plain in zip(sockets, plain_sockets):
            assert b"".join(made.bodies) == b"".join(plain.bodies)  # usage and [DONE] included
        for gen in gens:
            assert gen.times.send_lag_tokens == 4 and gen.times.send_lag_sum >= 0  # never written early
            assert gen.finish_reason == "length"
        # every step made ahead: its writes, then its deliveries; the finishing step's closing
        # events (they need the finished request) are written after its deliveries
        per_step = [log[6 * k:6 * k + 6] for k in range(4)]
        assert all([e[0] for e in step] == ["write"] * 3 + ["sink"] * 3 for step in per_step)
        assert [e[0] for e in log[24:]] == ["write"] * 3
        assert [e[0] for e in plain_log[:6]] == ["sink"] * 3 + ["write"] * 3

    asyncio.run(scenario())


def test_the_collector_waits_for_the_end_of_a_pass():
    async def scenario():
        core = serve_core()
        seen: list[bool] = []
        core._sinks["a"] = lambda d: seen.append(gc.isenabled())
        assert gc.isenabled()
        core._on_message(("step", time.perf_counter() + 0.002, [("a", [1], None, 0)], (1, 0, 1)))
        await asyncio.sleep(0.01)
        assert seen == [False] and gc.isenabled()

    asyncio.run(scenario())


class Counting:
    """A decoder whose text depends on what it decoded before (as a real one's may)."""

    def __init__(self) -> None:
        self.seen = 0

    def add(self, ids: list[int]) -> str:
        self.seen += len(ids)
        return "".join(f" {i}@{self.seen}" for i in ids)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 99), max_size=3), st.sampled_from(["held", "now", "take"])),
                min_size=1, max_size=14), st.integers(0, 14), st.booleans())
# a delivery declined while an earlier one waited, still held when the stream took what waited:
# the next step's must be declined too, or it is decoded before it
@example(events=[([], "held")] * 5 + [([], "now"), ([0], "held"), ([0], "held")], stream_starts=7, stops=False)
def test_text_made_ahead_is_the_text_decoded_in_order(events, stream_starts, stops):
    """Deliveries arrive in a step sent ahead (held: offered to prepare, received when due) or at
    once (now: the engine's early tokens, after every held one is out); before the stream starts
    they wait in the request; some are declined (stop strings). The text is the one
    decoded in arrival order, as when nothing is made ahead."""
    metrics = ServerMetrics(SimpleNamespace(snapshot=CoreSnapshot()), "m")
    core = SimpleNamespace(abort=lambda request_id: None)

    def run(ahead: bool) -> str:
        gen = Generation(core, SimpleNamespace(decoder=Counting), metrics, [1], SamplingParams(max_tokens=999),
                         ["\x00never"] if stops else [])
        held: list[Delivery] = []

        def release() -> None:
            for delivery in held:
                gen._receive(delivery)
            held.clear()

        gen.direct = None
        for k, (ids, kind) in enumerate(events):
            if k == stream_starts:  # the stream's writer takes what waited, then each as it comes
                gen.direct = lambda delivery: gen.take([delivery])  # (at the end of the loop's pass)
                gen.take(gen.pending())
            if kind == "take":
                release()
                continue
            if kind == "held":
                held.append(Delivery(ids, None, 0.0, 0, gen.prepare(ids, None) if ahead else None))
            else:
                release()
                gen._receive(Delivery(ids, None, 0.0))
        release()
        gen.take(gen.pending())
        return gen._text

    assert run(True) == run(False)


def test_a_step_held_behind_a_declined_one_is_not_made_ahead():
    """Through ServeCore: a token came without an offer (the engine's early tokens) before the
    stream began, so the next step's delivery is declined; the stream starts while that step is
    still held, and the step after it is offered: it must wait for the held one to be decoded."""

    async def scenario():
        core = serve_core()
        metrics = ServerMetrics(SimpleNamespace(snapshot=CoreSnapshot()), "m")
        gen = Generation(core, SimpleNamespace(decoder=Counting), metrics, [1], SamplingParams(max_tokens=9), [])
        gen.submit()
        rid = gen.request_id
        core._on_message(("tokens", time.perf_counter(), [(rid, [5], None, 0)]))  # waits in the request
        now = time.perf_counter()
        core._on_message(("step", now + 0.01, [(rid, [6], None, 0)], (1, 0, 1)))  # declined, held
        socket = Socket()
        writer = DirectWriter(socket, gen, Events(HEAD, False, False, False))  # takes the [5]
        core._on_message(("step", now + 0.02, [(rid, [7], None, 0)], (1, 0, 2)))
        core._on_message(("step", now + 0.03, [(rid, [8], FinishReason.LENGTH, 0)], (0, 0, 3)))
        await asyncio.wait_for(writer.finished, 1)
        assert gen._text == " 5@1 6@2 7@3 8@4"
        body = b"".join(socket.bodies)
        assert [body.index(t) for t in (b" 6@2", b" 7@3", b" 8@4")] == sorted(body.index(t) for t in
                                                                               (b" 6@2", b" 7@3", b" 8@4"))

    asyncio.run(scenario())


def test_a_step_made_ahead_writes_nothing_after_its_request_ended():
    async def scenario():
        core = serve_core()
        gen = generation(core, max_tokens=4)
        gen.submit()
        socket = Socket(hold=1)  # the closing write waits (a slow client)
        writer = DirectWriter(socket, gen, Events(HEAD, False, False, False))
        core._on_message(("step", time.perf_counter() + 0.003, [(gen.request_id, [7], None, 0)], (1, 0, 1)))
        core._end_streams()  # the core process is gone: the stream closes before the step is due
        await asyncio.sleep(0.01)
        socket.open.set_result(None)
        await asyncio.wait_for(writer.finished, 1)
        text = b"".join(socket.bodies)
        assert text.endswith(b"data: [DONE]\n\n") and b" w7" not in text

    asyncio.run(scenario())


def test_a_pass_over_a_step_made_ahead_measures_its_writes_per_delivery():
    async def slow(message) -> None:  # a write that holds the loop 0.5 ms
        until = time.perf_counter() + 5e-4
        while time.perf_counter() < until:
            pass

    async def scenario():
        core = serve_core()
        gens = [generation(core, max_tokens=3) for _ in range(4)]
        for gen in gens:
            gen.submit()
            DirectWriter(slow, gen, Events(HEAD, False, True, False))
        assert core._write_s == 0.0
        deliveries = [(g.request_id, [7 + i], None, 0) for i, g in enumerate(gens)]
        core._on_message(("step", time.perf_counter() + 0.003, deliveries, (4, 0, 0)))
        await asyncio.sleep(0.006)
        assert [g.output_ids for g in gens] == [[7], [8], [9], [10]]
        # one pass moves the average 1/WRITE_PASSES of the way to its 0.5 ms per delivery
        assert 5e-4 / WRITE_PASSES <= core._write_s < 5e-3 / WRITE_PASSES

    asyncio.run(scenario())
