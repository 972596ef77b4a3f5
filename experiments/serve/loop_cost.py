"""The server core loop's own host work per step against the harness's loop, on a CPU.

    python -m experiments.serve.loop_cost [--seqs 4,48] [--tokens 300] [--repeats 5]

The same requests (all arriving at once, --seqs of them, --tokens outputs each) are served by an
overlapping fake executor (submit() computes nothing worth timing, as a CUDA graph replay costs
the host little), so what is timed is the loops' Python: engine.core.loop.run (the harness's
loop) and harness.serve.core_loop.CoreLoop, without and with its token sender thread
(harness/serve/handoff.py, at its sys.setswitchinterval), sending its messages over a socket pair
to a `cat` that drains them.
Each figure is CPU time of the whole process (every thread: the sender's work counts) per step,
median over --repeats runs, so the machine's other load does not set it.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time

from engine.core import make_scheduler
from engine.core.loop import WallClock, run
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from harness.serve.core_loop import CoreLoop
from harness.serve.handoff import SWITCH_INTERVAL_S
from harness.serve.wire import CoreChannel
from tests.core.fakes import OverlappingFakeExecutor, _Done
from tests.harness.serve.test_core_loop import served_config


class _Sampled(_Done):
    def sampled(self) -> list[int]:
        return self._result.token_ids


class EarlyFake(OverlappingFakeExecutor):
    """The overlapping fake whose pending steps give their sampled ids ahead (EarlyTokens)."""

    def _queue(self, plan):
        return _Sampled(super()._queue(plan)._result)


class ScriptedChannel(CoreChannel):
    """A real socket (sends and the per-step poll's select) whose incoming messages are a script."""

    def __init__(self, sock: socket.socket, script: list) -> None:
        super().__init__(sock)
        self.script = script

    def poll(self) -> list:
        super().poll()
        return [self.script.pop(0)] if self.script else []

    def wait(self) -> list:
        return [self.script.pop(0)] if self.script else [("stop",)]


def requests(seqs: int, tokens: int) -> list[Request]:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    return [Request(f"r{i}", list(range(1, 65)), params, arrival_time=0.0) for i in range(seqs)]


def per_step(loop: str, seqs: int, tokens: int) -> float:
    """CPU seconds of the process per step for one run of `loop` (harness, server, server_sender)."""
    executor = EarlyFake(8192, 16)
    config = served_config(["backend=sim", "model=qwen3-8b", "hardware=h100"])
    scheduler = make_scheduler(config.scheduler, executor.info(), config.cache)
    if loop == "harness":
        began = time.process_time()
        steps = len(run(scheduler, executor, requests(seqs, tokens), WallClock()).steps)
        return (time.process_time() - began) / steps
    ours, theirs = socket.socketpair()
    drain = subprocess.Popen(["sh", "-c", "cat > /dev/null"], stdin=theirs.fileno())
    theirs.close()
    clock = WallClock()
    channel = ScriptedChannel(ours, [("add", r, clock.origin) for r in requests(seqs, tokens)])
    core = CoreLoop(scheduler, executor, clock, channel, early_tokens=loop == "server_sender")  # type: ignore[arg-type]
    interval = sys.getswitchinterval()
    if loop == "server_sender":  # as the engine's core process sets it (harness.serve.core_loop.serve_core)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        began = time.process_time()
        steps = len(core.run().steps)
        return (time.process_time() - began) / steps
    finally:
        sys.setswitchinterval(interval)
        ours.close()
        drain.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=lambda s: [int(x) for x in s.split(",")], default=[4, 48])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if min(args.seqs) < 1 or args.tokens < 2 or args.repeats < 1:
        parser.error("--seqs, --tokens (>= 2) and --repeats must be positive")
    loops = ("harness", "server", "server_sender")
    print("| sequences | " + " | ".join(f"{loop} us/step" for loop in loops) + " |")
    print("|---|" + "---|" * len(loops))
    for seqs in args.seqs:
        times = {loop: [] for loop in loops}
        for _ in range(args.repeats):  # alternating, so a change in the machine's load hits each alike
            for loop in loops:
                times[loop].append(per_step(loop, seqs, args.tokens))
        print(f"| {seqs} | " + " | ".join(f"{statistics.median(times[loop]) * 1e6:.1f}" for loop in loops) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
