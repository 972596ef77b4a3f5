"""Overlapped steps in the server (harness.serve.handoff): a step's tokens reach the HTTP side
while the loop is still submitting the next step, every token is handed out exactly once, and in
order even though the HTTP side hands early tokens out at once, past any "step" message it holds."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import make_scheduler
from engine.core.loop import WallClock
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from harness.serve.core_loop import CoreLoop
from harness.serve.wire import WireProtocol, frame
from tests.core.fakes import OverlappingFakeExecutor, _Done
from tests.harness.serve.test_core_loop import served_config
from tests.harness.serve.test_release import serve_core

SLOW_SUBMIT_S = 0.15


class _Sampled(_Done):
    def sampled(self) -> list[int]:
        return self._result.token_ids


class SlowSubmitExecutor(OverlappingFakeExecutor):
    """Overlapped steps whose submission keeps the host busy (in Python, holding the GIL) for
    SLOW_SUBMIT_S when the step prefills: an eager prefill's kernel launches."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.submits: list[tuple[int, float, float]] = []  # (step, began, returned)

    def _queue(self, plan):
        began = time.perf_counter()
        if plan.stats.step > 0 and plan.stats.num_prefill_tokens:
            while time.perf_counter() - began < SLOW_SUBMIT_S:
                pass
        done = super()._queue(plan)
        self.submits.append((plan.stats.step, began, time.perf_counter()))
        return _Sampled(done._result)


class RecordingChannel:
    """Hands out a script of message batches, one per poll or wait; records what is sent, when."""

    def __init__(self, script: list[list]) -> None:
        self.script = script
        self.sent: list[tuple[float, tuple]] = []
        self.closed = False

    def poll(self) -> list:
        return self.script.pop(0) if self.script else []

    def wait(self) -> list:
        return self.script.pop(0) if self.script else [("stop",)]

    def send(self, message: tuple) -> None:
        self.sent.append((time.perf_counter(), message))


def serve(requests: list[Request], eos_every: int = 0, early: bool = True):
    rc = served_config(["backend=sim", "model=qwen3-8b", "hardware=h100"])
    executor = SlowSubmitExecutor(4096, 16, eos_token_id=7 if eos_every else None, eos_every=eos_every)
    scheduler = make_scheduler(rc.scheduler, executor.info(), rc.cache)
    clock = WallClock()
    # the second request arrives once the first is decoding: its prefill step is the slow submission
    script = [[("add", requests[0], clock.origin)], [], [], *[[("add", r, clock.origin)] for r in requests[1:]]]
    channel = RecordingChannel(script)
    loop = CoreLoop(scheduler, executor, clock, channel, early_tokens=early)  # type: ignore[arg-type]
    return loop.run(), channel, executor


def delivered(channel: RecordingChannel) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for _, message in channel.sent:
        if message[0] in ("tokens", "step"):
            for rid, ids, *_ in message[2]:
                out.setdefault(rid, []).extend(ids)
    return out


def replayed(channel: RecordingChannel, rids: list[str]) -> dict[str, list]:
    """What each request's sink gets from a real ServeCore fed every message the core loop sent in
    one socket read: the worst case, where every "step" is held until the next loop turn while
    every "tokens" message behind it is handed out at once. Per request: its token ids, then its
    finish reason."""

    async def scenario():
        core = serve_core()
        got: dict[str, list] = {rid: [] for rid in rids}
        for rid in rids:
            core._sinks[rid] = lambda d, out=got[rid]: out.extend([*d.token_ids, *([d.finish_reason] * bool(
                d.finish_reason))])
        wire = WireProtocol(core._on_message, lambda exc: None)
        wire.data_received(b"".join(frame(m) for _, m in channel.sent if m[0] in ("tokens", "step")))
        while core._held or core._timer is not None:
            await asyncio.sleep(0)
        return got

    return asyncio.run(scenario())


def request(rid: str, prompt: int, max_tokens: int, ignore_eos: bool = True) -> Request:
    return Request(rid, [5 + (i + len(rid)) % 900 for i in range(prompt)],
                   SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))


@pytest.mark.parametrize("early", [True, False])
def test_a_token_is_handed_out_before_the_next_step_is_submitted(early):
    result, channel, executor = serve([request("a", 40, 6), request("b", 400, 3)], early=early)
    slow = [(began, returned) for step, began, returned in executor.submits if returned - began >= SLOW_SUBMIT_S]
    assert slow, "the second request's prefill was submitted slowly"
    began, returned = slow[0]
    # the step before the slow one sampled a token of "a": when did it leave?
    sent_at = [at for at, message in channel.sent if message[0] in ("tokens", "step")
               and any(rid == "a" and ids for rid, ids, *_ in message[2]) and at > began]
    if early:
        assert sent_at[0] < began + SLOW_SUBMIT_S / 3  # while the next step was still being submitted
    else:  # the loop alone sends it after that submission (the wait the sender removes)
        assert sent_at[0] >= returned
    assert {r.request_id: r.output_token_ids for r in result.requests} == delivered(channel)


def test_every_token_once_with_eos_stops():
    # requests that stop on EOS leave a step already planned for them: its token is not theirs
    requests = [request(f"r{i}", 20 + 30 * i, 40, ignore_eos=False) for i in range(6)]
    result, channel, _ = serve(requests, eos_every=5)
    outputs = {r.request_id: r.output_token_ids for r in result.requests}
    assert any(len(ids) < 40 for ids in outputs.values()), "some request stopped on EOS"
    assert outputs == delivered(channel)
    finishes = [rid for _, m in channel.sent if m[0] == "step" for rid, _, reason, _ in m[2] if reason is not None]
    assert sorted(finishes) == sorted(outputs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_engines_overlapped_steps_hand_out_their_tokens_early(tiny_checkpoint, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from engine.llm import LLM

    llm = LLM(str(tiny_checkpoint), device=device, max_model_len=256, block_size=16, num_blocks=64,
              async_scheduling=True)
    try:
        requests = [request(f"r{i}", 20 + 40 * i, 4 + i) for i in range(3)]
        clock = WallClock()
        channel = RecordingChannel([*[[("add", r, clock.origin)] for r in requests]])
        loop = CoreLoop(llm.scheduler, llm.executor, clock, channel, early_tokens=True)  # type: ignore[arg-type]
        result = loop.run()
    finally:
        llm.shutdown()
    outputs = {r.request_id: r.output_token_ids for r in result.requests}
    assert outputs == delivered(channel) and [len(outputs[r.request_id]) for r in requests] == [4, 5, 6]
    early = sum(len(ids) for _, m in channel.sent if m[0] == "tokens" for _, ids, *_ in m[2])
    assert early == sum(map(len, outputs.values()))  # every token went out through the sender
    reasons = {r.request_id: r.finish_reason for r in result.requests}
    assert replayed(channel, list(outputs)) == {rid: [*ids, reasons[rid]] for rid, ids in outputs.items()}


class SampledExecutor(OverlappingFakeExecutor):
    """The overlapping fake whose pending steps give their sampled ids ahead (EarlyTokens)."""

    def _queue(self, plan):
        return _Sampled(super()._queue(plan)._result)


def test_a_requests_tokens_never_pass_each_other():
    """ServeCore hands a "tokens" message out at once, past a "step" message it still holds: safe
    because with the sender a step message carries no token ids, only finish reasons, and a request
    finished there is in no later "tokens" message (handoff's rule is update's). A small cache
    preempts requests with a token pending; EOS stops leave a step already planned."""
    rc = served_config(["backend=sim", "model=qwen3-8b", "hardware=h100"])  # once: composing takes a while

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.tuples(st.integers(1, 120), st.integers(1, 24), st.booleans()), min_size=1, max_size=6),
           st.sampled_from([0, 3, 7]), st.integers(10, 40), st.lists(st.integers(0, 3), min_size=6, max_size=6))
    def check(shapes, eos_every, num_blocks, gaps):
        requests = [request(f"r{i}", prompt, max_tokens, ignore_eos) for i, (prompt, max_tokens, ignore_eos)
                    in enumerate(shapes)]
        executor = SampledExecutor(num_blocks, 16, eos_token_id=7 if eos_every else None, eos_every=eos_every)
        scheduler = make_scheduler(rc.scheduler, executor.info(), rc.cache)
        clock = WallClock()
        script: list[list] = []
        for r, gap in zip(requests, gaps):  # each arrives a few loop turns after the one before
            script += [[]] * gap + [[("add", r, clock.origin)]]
        channel = RecordingChannel(script)
        result = CoreLoop(scheduler, executor, clock, channel, early_tokens=True).run()  # type: ignore[arg-type]
        outputs = {r.request_id: r.output_token_ids for r in result.requests}
        assert sorted(outputs) == sorted(r.request_id for r in requests)
        finished: set[str] = set()
        for _, message in channel.sent:
            if message[0] == "step":
                assert all(not ids for _, ids, _, _ in message[2]), "a held step carries tokens"
                finished |= {rid for rid, _, reason, _ in message[2] if reason is not None}
            elif message[0] == "tokens":
                assert not finished & {rid for rid, *_ in message[2]}, "tokens after their request's finish"
        reasons = {r.request_id: r.finish_reason for r in result.requests}
        assert replayed(channel, list(outputs)) == {rid: [*ids, reasons[rid]] for rid, ids in outputs.items()}

    check()
