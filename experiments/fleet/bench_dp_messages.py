"""The per-step host cost of a data-parallel engine replica, before and after replicas ran their
own loops, timed side by side on the CPU (no model: the messages and the scheduler only).

  before  the main process planned every replica's step and sent it: each step was a StepPlan
          pickled out over the replica's pipe and a StepResult pickled back (a round trip the
          replica's device waited on), and every replica's schedule() + update() ran in turn
          on the main process's one thread.
  after   each replica plans its own steps (schedule() + update() in its process, hidden behind
          the device step in flight when steps overlap) and sends one Report per step, one way:
          its StepRecord, the requests the step finished, its load.

For decode steps of --batch requests of --context tokens (plans built by the real scheduler),
it times the round trip, the report's send in the replica and the load it carries, and
schedule() + update() (medians; a busy machine inflates all of them alike):

  python experiments/fleet/bench_dp_messages.py [--batch 8 64 256] [--context 1024] [--steps 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import statistics
import sys
import time

from engine.core import BackendInfo, Request, SamplingParams, SchedulerConfig, StepResult, make_scheduler
from engine.core.loop import StepRecord, tokens_left
from engine.core.remote_replica import Report

BLOCK = 16
OUTPUT_LEN = 256  # a request finishes every OUTPUT_LEN / batch steps: the reports carry it then


def decode_step(batch: int, context: int):
    """A scheduler with `batch` requests decoding at `context` tokens, and its next plan."""
    config = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=max(8192, context),
                             max_model_len=context + 2 * OUTPUT_LEN)
    info = BackendInfo(batch * ((context + 2 * OUTPUT_LEN) // BLOCK + 1), BLOCK, 151_936)
    scheduler = make_scheduler(config, info)
    for i in range(batch):
        scheduler.add(Request(str(i), [(7 * i + t) % 50_000 for t in range(context)],
                              SamplingParams(max_tokens=2 * OUTPUT_LEN, ignore_eos=True)))
    plan = scheduler.schedule()
    while plan.stats.kind != "decode":
        scheduler.update(plan, StepResult([1] * len(plan.scheduled), 1e-3))
        plan = scheduler.schedule()
    return scheduler, plan


def reports(plan, batch: int, context: int, steps: int) -> list[Report]:
    """What a replica sends after each of `steps` decode steps (one finished request now and then)."""
    record = StepRecord(0.0, 3e-3, plan.stats, 1e-4)
    done = Request("done", list(range(context)), SamplingParams(max_tokens=OUTPUT_LEN))
    done.token_ids.extend(range(OUTPUT_LEN))
    every = max(1, OUTPUT_LEN // batch)
    return [Report([record], [done] if i % every == 0 else [], {}, batch, batch * OUTPUT_LEN) for i in range(steps)]


def _echo(conn) -> None:
    """Before: the replica side of a step (unpickle the plan, answer a StepResult)."""
    while (message := conn.recv())[0] == "step":
        conn.send(("done", StepResult([1] * len(message[1].scheduled), 3e-3)))


def _reporter(conn, payload: bytes) -> None:
    """After: the replica side (send each step's Report); answers the median send time."""
    items = pickle.loads(payload)
    times = []
    for report in items:
        start = time.perf_counter()
        conn.send(("report", report))
        times.append(time.perf_counter() - start)
    conn.send(("median", statistics.median(times)))


def round_trip_s(plan, steps: int) -> float:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_echo, args=(child,), daemon=True)
    proc.start()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        parent.send(("step", plan))
        parent.recv()
        times.append(time.perf_counter() - start)
    parent.send(("stop", None))
    proc.join()
    return statistics.median(times)


def report_send_s(items: list[Report]) -> float:
    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_reporter, args=(child, pickle.dumps(items)), daemon=True)
    proc.start()
    while (message := parent.recv())[0] == "report":
        pass
    proc.join()
    return message[1]


def scheduler_s(scheduler, plan, steps: int) -> float:
    """schedule() + update() of one decode step (the plain scheduler's, as before)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        scheduler.update(plan, StepResult([1] * len(plan.scheduled), 3e-3))
        plan = scheduler.schedule()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_s(scheduler, steps: int) -> float:
    """The load a report carries (Replica.outstanding_tokens() over the scheduler's requests)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        sum(map(tokens_left, scheduler.requests.values()))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args(argv)
    print("| batch | plan + result bytes | before: round trip (us) | report bytes | after: report send (us) "
          "| after: its load (us) | schedule + update (us) |\n|---|---|---|---|---|---|---|")
    for batch in args.batch:
        scheduler, plan = decode_step(batch, args.context)
        result = StepResult([1] * len(plan.scheduled), 3e-3)
        items = reports(plan, batch, args.context, args.steps)
        report_bytes = statistics.mean(len(pickle.dumps(r)) for r in items[: max(1, OUTPUT_LEN // batch)])
        trip, send = round_trip_s(plan, args.steps), report_send_s(items)
        host = scheduler_s(scheduler, plan, min(args.steps, OUTPUT_LEN - 1))
        print(f"| {batch} | {len(pickle.dumps(plan)) + len(pickle.dumps(result)):,} | {trip * 1e6:.0f} "
              f"| {report_bytes:,.0f} | {send * 1e6:.0f} | {load_s(scheduler, args.steps) * 1e6:.0f} "
              f"| {host * 1e6:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
