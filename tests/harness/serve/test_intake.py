"""harness.serve.intake: a burst of requests goes into the app one per turn of the loop, so what
the loop has to do meanwhile (a due step's timer, a socket's data) runs between two of them."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

from harness.serve.intake import Intake

BURST, WORK_S = 40, 1e-3


def _busy(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def _burst(intake: Intake | None, log: list) -> None:
    """BURST requests reach the app in one turn, each with WORK_S of CPU work; a timer is due
    after 3 of them."""
    loop = asyncio.get_running_loop()

    async def request(i: int) -> None:
        if i == 0:
            # armed as the burst starts: armed before it, on a loaded host the timer could be due
            # before the first request runs, whatever the intake does
            loop.call_later(3 * WORK_S, log.append, "timer")
        if intake is not None:
            await intake.turn()
        log.append(i)
        _busy(WORK_S)

    await asyncio.gather(*(request(i) for i in range(BURST)))


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_a_due_timer_runs_between_the_requests_of_a_burst(loop_factory):
    gated: list = []
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_burst(Intake(), gated))
    plain: list = []
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_burst(None, plain))
    assert plain.index("timer") == BURST  # without an intake the whole burst is one turn
    assert gated.index("timer") <= 6  # with it, the timer waits for a request or two past its time
    assert [i for i in gated if i != "timer"] == list(range(BURST))  # in order of arrival


def test_a_cancelled_waiter_does_not_hold_up_the_rest():
    async def scenario() -> list[int]:
        intake, log = Intake(), []

        async def request(i: int) -> None:
            await intake.turn()
            log.append(i)

        tasks = [asyncio.ensure_future(request(i)) for i in range(5)]
        await asyncio.sleep(0)  # request 0 is in; the rest wait
        tasks[2].cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 1)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await intake.turn()  # the door is open again: the next request goes in at once
        log.append(99)
        return log

    assert asyncio.run(scenario()) == [0, 1, 3, 4, 99]
