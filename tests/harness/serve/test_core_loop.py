"""The core process's loop (harness.serve.core_loop) and what it is built from.

The server's engine must be the run's: the same RunConfig reaches harness.run.make_executor in the
core process, so the config `python -m harness.serve` composes must equal `python -m harness`'s for
the same overrides (CUDA graphs, async scheduling, max_num_seqs: a server that stepped slower than
the run because of its own settings would be measured, not the HTTP side). And the loop must never
wait on its socket while it has work: it polls between steps and blocks only when idle.
"""

from __future__ import annotations

import time

import pytest
from hydra import compose, initialize_config_dir

from engine.core import make_scheduler
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from harness.config import CONF_DIR, build_run_config
from harness.run import make_executor
from harness.scripting import compose_run_config
from harness.serve.core_loop import CoreLoop, PacedClock

ENGINE = ["backend=engine", "model=qwen3-0.6b", "hardware=h100", "backend.load_format=dummy"]


def served_config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return build_run_config(compose(config_name="serving", overrides=overrides))


@pytest.mark.parametrize("extra", [[], ["execution.enforce_eager=true", "scheduler.max_num_seqs=64"]])
def test_the_server_builds_the_engine_a_run_builds(extra):
    served, run = served_config([*ENGINE, *extra]), compose_run_config([*ENGINE, *extra])
    assert served.engine == run.engine and served.engine.execution == run.engine.execution
    assert served.scheduler == run.scheduler and served.cache == run.cache and served.model == run.model


class ScriptedChannel:
    """A CoreChannel that hands out scripted messages and records how the loop asked for them."""

    def __init__(self, script: list[list]) -> None:
        self.script = script
        self.calls: list[tuple[str, int]] = []  # (poll or wait, requests the loop held then)
        self.sent: list[tuple] = []
        self.closed = False
        self.loop: CoreLoop | None = None

    def _next(self, kind: str, otherwise: list) -> list:
        held = self.loop.scheduler.has_unfinished() or bool(self.loop.replica.inbox)
        self.calls.append((kind, held))
        return self.script.pop(0) if self.script else otherwise

    def poll(self) -> list:
        return self._next("poll", [])

    def wait(self) -> list:
        return self._next("wait", [("stop",)])  # the script is done and the loop idle: stop it

    def send(self, message: tuple) -> None:
        self.sent.append(message)


def test_the_loop_blocks_only_when_it_has_nothing_to_do():
    rc = served_config(["backend=sim", "model=qwen3-8b", "hardware=h100"])
    executor = make_executor(rc)
    scheduler = make_scheduler(rc.scheduler, executor.info(), rc.cache)
    clock = PacedClock(1e9)  # simulated time a billion times faster than the wall: no sleeping
    stamp = clock.origin

    def request(rid: str, n: int) -> Request:
        return Request(rid, list(range(1, 40)), SamplingParams(max_tokens=n, ignore_eos=True))

    # idle: wait for the first request; busy: polls see nothing for a while, then a second request
    script = [[("add", request("a", 20), stamp)], *[[] for _ in range(5)], [("add", request("b", 3), stamp)]]
    channel = ScriptedChannel(script)
    loop = CoreLoop(scheduler, executor, clock, channel)  # type: ignore[arg-type]
    channel.loop = loop
    result = loop.run()
    assert [(r.request_id, r.num_output_tokens) for r in result.requests] == [("b", 3), ("a", 20)]
    assert channel.calls[0] == ("wait", False)  # nothing held: it may block
    assert all(kind == "poll" for kind, held in channel.calls if held)  # work held: never blocks
    assert channel.calls[-1] == ("wait", False)  # idle again once both finished
    steps = [m for m in channel.sent if m[0] == "step"]
    delivered = {rid: sum(len(ids) for m in steps for r, ids, *_ in m[2] if r == rid) for rid in "ab"}
    assert delivered == {"a": 20, "b": 3}  # every token handed out once


class TimedChannel:
    """Messages handed out once their wall time (perf_counter) has come, as a socket would."""

    def __init__(self, timed: list[tuple[float, tuple]]) -> None:
        self.timed = timed
        self.sent: list[tuple] = []
        self.closed = False

    def poll(self) -> list:
        now = time.perf_counter()
        due = [message for at, message in self.timed if at <= now]
        self.timed = [(at, message) for at, message in self.timed if at > now]
        return due

    def wait(self) -> list:
        if not self.timed:
            return [("stop",)]
        time.sleep(max(0.0, self.timed[0][0] - time.perf_counter()))
        return self.poll()

    def send(self, message: tuple) -> None:
        self.sent.append(message)


@pytest.mark.parametrize("after_launches", [True, False])
def test_the_simulated_server_takes_arrivals_when_the_loop_plans_again(after_launches):
    """With backend.plan_after_launches the simulator's server sleeps until the prefill in flight's
    launches are over before it takes new messages (Replica.plan_time): b, sent 6 ms (simulated)
    into a's 8 ms of launches, is prefilled in the very next step, as the engine's loop would; without
    the rule the loop plans a's decode at once and b waits for it."""
    from engine.core import SchedulerConfig
    from engine.core.executor import BackendInfo
    from sim.executor import SimExecutor
    from tests.sim.test_plan_time import _Fixed

    info = BackendInfo(num_blocks=64, block_size=4, vocab_size=97, eos_token_ids=(5,), overlaps_steps=True)
    executor = SimExecutor(_Fixed(0.008), info, seed=1, plan_after_launches=after_launches)
    scheduler = make_scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=60), info)
    scale = 0.02  # 1 ms simulated = 50 ms on the wall: margins a busy CI machine keeps
    clock = PacedClock(scale)
    a = Request("a", [1] * 8, SamplingParams(max_tokens=4, ignore_eos=True))
    b = Request("b", [2] * 8, SamplingParams(max_tokens=4, ignore_eos=True))
    channel = TimedChannel([(clock.origin, ("add", a, clock.origin)),
                            (clock.origin + 0.006 / scale, ("add", b, clock.origin + 0.006 / scale))])
    result = CoreLoop(scheduler, executor, clock, channel).run()  # type: ignore[arg-type]
    kinds = [step.stats.kind for step in result.steps][:3]
    assert kinds == (["prefill", "prefill", "decode"] if after_launches else ["prefill", "decode", "prefill"])
