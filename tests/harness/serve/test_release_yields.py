"""The last fraction before a held step's time is slept in slices (harness.serve.passes.SLEEP_SLICE_S)
with the loop's other work between them: a request that reaches the server meanwhile is read and
handed to its handler at once, as the engine's server does, not after the whole wait (which, with a
step every 2 ms, held each arrival several ms: docs/serving.md#arrivals-wait-for-no-step)."""

from __future__ import annotations

import asyncio

from harness.serve import passes
from tests.harness.serve.test_release import serve_core


class Clock:
    """passes' clock: perf_counter() stands still but for what sleep() adds, so that the order of
    the loop's callbacks, not the machine's load, decides what the test sees."""

    def __init__(self, events: list[tuple]) -> None:
        self.now = 1000.0
        self.events = events

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.events.append(("sleep", seconds))
        self.now += seconds


def test_the_loop_runs_other_work_while_a_step_waits_for_its_time(monkeypatch):
    events: list[tuple] = []
    clock = Clock(events)
    monkeypatch.setattr(passes, "time", clock)

    async def scenario():
        core = serve_core()
        core._sinks["a"] = lambda d: events.append(("out", clock.now, d.due))

        async def other_work():  # what a request's bytes and its handler are to the loop
            while sum(e[0] == "out" for e in events) < 2:
                events.append(("work",))
                await asyncio.sleep(0)

        worker = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        due = clock.now + 1.8 * passes.TIMER_SLACK_S  # inside the slept fraction at once
        core._on_message(("step", due, [("a", [1], None, 0)], (1, 0, 1)))
        core._on_message(("step", due + 1e-4, [("a", [2], None, 0)], (1, 0, 2)))  # one more while it waits
        await asyncio.wait_for(worker, 1)
        kinds = [e[0] for e in events]
        waiting = kinds[kinds.index("sleep"):kinds.index("out")]
        assert "work" in waiting and waiting.count("work") >= waiting.count("sleep") - 1  # the loop ran between slices
        assert max(e[1] for e in events if e[0] == "sleep") <= passes.SLEEP_SLICE_S
        outs = [e for e in events if e[0] == "out"]
        assert len(outs) == 2 and all(when >= d for _, when, d in outs)  # each once, never before its time

    asyncio.run(scenario())


def test_releasing_everything_at_the_end_waits_for_nothing(monkeypatch):
    events: list[tuple] = []
    clock = Clock(events)
    monkeypatch.setattr(passes, "time", clock)

    async def scenario():
        core = serve_core()
        core._sinks["a"] = lambda d: events.append(("out", d.token_ids))
        core._held.append(("step", clock.now + passes.TIMER_SLACK_S, [("a", [1], None, 0)], (1, 0, 1), None, 1))
        core._release(everything=True)  # the core's result came: every held step goes now, in this call
        assert events == [("out", [1])]

    asyncio.run(scenario())
